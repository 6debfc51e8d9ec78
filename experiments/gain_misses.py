"""Where a policy loses goodput: which requests miss their SLO, and why.

    python -m experiments.gain_misses --setting poisson --rate R --row horizon_learned
        --row sjf_prompt [--seeds 0 1 2 3 4] [--out results/policy_gain]

For each row at one load, every seed of the headline's plan: the share of requests that miss
because they did not finish in the run, because their first token came late (TTFT), or because
a later gap was too long (ITL, with TTFT met); and lifetime goodput per quartile of the true
output length and of the prompt length (quartile edges from that seed's requests). Means over
seeds. Writes ``misses_<setting>_r<rate>.json`` into ``--out``; its LAST line is that JSON.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from experiments.components import build_components
from experiments.gain_settings import rows_of
from experiments.policy_gain import EVAL_SEEDS, FULL, REPO, compose_rows
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload
from horizon.metrics import RunRecords, lifetime_good, max_itl, slo_arrays, ttft
from horizon.metrics.records import STATUS_FINISHED
from horizon.request import SLO


def breakdown(rec: RunRecords, slo: SLO) -> dict:
    """Shares of one run's requests by outcome, and goodput per length quartile."""
    n = rec.num_requests
    t_slo, i_slo = slo_arrays(rec, slo)
    done = rec.status == STATUS_FINISHED
    late = done & ~(ttft(rec) <= t_slo)
    worst = max_itl(rec)
    gap = done & ~late & ~(np.isnan(worst) | (worst <= i_slo))
    good = lifetime_good(rec, slo)
    return {
        "goodput": float(good.mean()),
        "unfinished": float(np.count_nonzero(~done)) / n,
        "ttft_miss": float(np.count_nonzero(late)) / n,
        "itl_miss": float(np.count_nonzero(gap)) / n,
        "goodput_by_output_quartile": _by_quartile(rec.true_output_tokens, good),
        "goodput_by_prompt_quartile": _by_quartile(rec.num_prompt_tokens, good),
    }


def _by_quartile(x: np.ndarray, good: np.ndarray) -> list[float]:
    edges = np.quantile(x, (0.25, 0.5, 0.75))
    q = np.searchsorted(edges, x, side="right")  # 0..3
    return [float(good[q == k].mean()) if np.any(q == k) else float("nan") for k in range(4)]


def measure(setting: str, rate: float, rows: list[str], seeds: tuple[int, ...]) -> dict:
    cfgs = compose_rows(setting, {r: o for r, o in rows_of(setting).items() if r in rows}, [])
    sources = DataSources(next(iter(cfgs.values())).data)
    out: dict = {"setting": setting, "rate": rate, "seeds": list(seeds), "rows": {}}
    for row in rows:
        per_seed = []
        for seed in seeds:
            cfg = replace(cfgs[row], rate=rate, seed=seed, num_requests=FULL.num_requests)
            parts = build_components(cfg, sources)
            res = simulate(cfg, make_workload(cfg, sources), parts)
            per_seed.append(breakdown(res.records, parts.slo))
        out["rows"][row] = _mean(per_seed)
    return out


def _mean(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        vals = np.array([r[k] for r in runs], dtype=float)
        out[k] = np.round(np.nanmean(vals, axis=0), 4).tolist()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", default="poisson")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--row", action="append", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(EVAL_SEEDS))
    ap.add_argument("--out", default=str(REPO / "results" / "policy_gain"))
    args = ap.parse_args(argv)
    result = measure(args.setting, args.rate, args.row, tuple(args.seeds))
    path = Path(args.out) / f"misses_{args.setting}_r{args.rate:g}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
