"""A hindsight reference for ``rate_at_90``: how many requests stay good when the largest give
way, chosen knowing the whole run in advance.

Past the machine's capacity some requests must start late; the most requests stay good when the
ones that give way are those that cost the most. This command measures what that buys, apart
from how well a policy finds them online. For a run of the headline setting
(``experiments.policy_gain``: policy, rate, seed) it

1. ranks the run's requests by KV token-steps, ``p * o + o**2 / 2`` for a prompt of ``p``
   tokens and a reply of ``o``: the blocks a request holds, summed over its decode steps. ``o``
   is the true length (``--row POLICY:true``) or the median the policy's own predictor gives at
   arrival (``--row POLICY:predicted``: what the policy knows when it decides to start one);
2. takes the top ``fraction`` out of the run (they count as not good, as if served once the
   overload is over) and lets the policy serve the rest, unchanged;
3. reports goodput over *all* the run's requests: ``good kept / n``.

Per (row, rate) one fraction serves all seeds: the best on the grid by mean goodput. The
result is a reference, not a bound: a policy that also knew arrival times could shed only
inside an overload, and one fraction for the whole run is coarse. It separates the two losses
the headline's ``rate_at_90`` mixes: of the online policy against hindsight with the same
information (``predicted`` against the policy's own run), and of the predictor (``predicted``
against ``true``).

Run (``--quick`` for a small version)::

    python -m experiments.shedding_reference --out results/shedding_reference

Noisy-oracle rows draw their noise by request id, and the kept requests are renumbered: the
run's draws differ from the ranking's (same ``sigma``). The learned and oracle predictors read
request contents only, so their ranking and their run agree.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from hydra import initialize_config_dir

from experiments import compact_json
from experiments.components import build_components
from experiments.config_store import register_configs
from experiments.gain_runner import Plan, Runner
from experiments.gain_settings import SHIPPED_ROWS
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload
from horizon.metrics import goodput
from horizon.request import Request
from horizon.workload import Workload
from horizon.workload.builder import fresh_copy

REPO = Path(__file__).resolve().parents[1]
KEYS = ("true", "predicted")
ROWS: tuple[tuple[str, str], ...] = (
    ("horizon_oracle", "true"),
    ("horizon_learned", "predicted"),
)
# the previous headline's policies as shipped, and Horizon with noisy oracles (the predictor
# quality a rate needs)
SHED_POLICIES: dict[str, list[str]] = {
    **SHIPPED_ROWS,
    "horizon_noisy_s025": ["policy=horizon_noisy_s025_m10"],
    "horizon_noisy_s05": ["policy=horizon_noisy_s05_m10"],
}
FULL = Plan(num_requests=4000, seeds=(0, 1, 2), iterations=8, lo=20.0, hi=200.0)
QUICK = Plan(num_requests=600, seeds=(0,), iterations=5, lo=20.0, hi=200.0)
RATES: tuple[float, ...] = (80.0, 84.0, 88.0)
FRACTIONS: tuple[float, ...] = (0.0, 0.03, 0.06, 0.08, 0.09, 0.1, 0.12)


def token_steps(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """KV token-steps of requests with ``prompt`` and ``output`` tokens: ``p*o + o**2/2``."""
    p = np.asarray(prompt, dtype=np.float64)
    o = np.asarray(output, dtype=np.float64)
    if p.shape != o.shape:
        raise ValueError(f"token_steps: {p.shape} prompts against {o.shape} outputs")
    if (p < 0).any() or (o < 0).any():
        raise ValueError("token_steps: lengths must be >= 0")
    return p * o + o * o / 2


def shed(requests: Sequence[Request], dropped: np.ndarray) -> tuple[Request, ...]:
    """Fresh copies of the ``requests`` not marked in ``dropped`` (``shed_mask``'s output).

    The kept requests keep their order and arrival times and are renumbered ``0..k-1`` (a
    workload's ids are its indices).
    """
    dropped = np.asarray(dropped, dtype=bool)
    if dropped.shape != (len(requests),):
        raise ValueError(f"shed: a mask of {dropped.shape} for {len(requests)} requests")
    kept = np.flatnonzero(~dropped)
    return tuple(fresh_copy(requests[int(i)], j) for j, i in enumerate(kept))


def shed_mask(cost: np.ndarray, fraction: float) -> np.ndarray:
    """True for the ``floor(fraction * n)`` costliest of ``n`` costs (ties: the later goes)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"shed: fraction must be in [0, 1), got {fraction!r}")
    cost = np.asarray(cost, dtype=np.float64)
    # stable sort of -cost: among equal costs the earlier request ranks first, so the later goes
    order = np.argsort(-cost, kind="stable")
    mask = np.zeros(len(cost), dtype=bool)
    mask[order[: int(fraction * len(cost))]] = True
    return mask


@dataclass(frozen=True)
class ShedRun:
    """One run with a fraction shed: ``good`` of the ``kept`` requests met their SLOs."""

    fraction: float
    n: int
    kept: int
    good: int
    shed_token_steps: float  # share of the run's (true) token-steps that was shed

    @property
    def goodput(self) -> float:
        """Lifetime goodput over all ``n`` requests (the shed count as not good)."""
        return self.good / self.n

    @property
    def kept_goodput(self) -> float:
        return self.good / self.kept if self.kept else float("nan")


class ShedRunner:
    """Runs one (policy, rate, seed) at several shed fractions, ranking once."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def runs(
        self, policy: str, key: str, rate: float, seed: int, fractions: Sequence[float]
    ) -> list[ShedRun]:
        if key not in KEYS:
            raise ValueError(f"shedding_reference: key must be one of {KEYS}, got {key!r}")
        cfg = self.runner.config(policy, rate, seed)
        if self.runner.sources is None:
            self.runner.sources = DataSources(cfg.data)
        sources = self.runner.sources
        workload = make_workload(cfg, sources)
        requests = workload.new_requests()
        prompt = np.asarray([r.num_prompt_tokens for r in requests], dtype=np.float64)
        true = np.asarray([r.true_output_tokens for r in requests], dtype=np.float64)
        true_cost = token_steps(prompt, true)
        cost = true_cost if key == "true" else token_steps(prompt, self._medians(cfg, requests))
        out = []
        for f in fractions:
            dropped = shed_mask(cost, f)
            kept = shed(requests, dropped)
            result = simulate(cfg, _with(workload, kept), build_components(cfg, sources))
            self.runner.runs += 1
            self.runner.progress.update()
            good = int(goodput.lifetime_good(result.records).sum())
            out.append(
                ShedRun(
                    fraction=float(f),
                    n=len(requests),
                    kept=len(kept),
                    good=good,
                    shed_token_steps=float(true_cost[dropped].sum() / true_cost.sum()),
                )
            )
        return out

    def _medians(self, cfg, requests: Sequence[Request]) -> np.ndarray:  # noqa: ANN001
        pred_cfg = cfg.policy.predictor_config
        if pred_cfg is None:
            raise ValueError(
                f"shedding_reference: policy {cfg.policy.name!r} has no predictor; "
                "rank it by true sizes (--row POLICY:true)"
            )
        predictor = self.runner.sources.predictor(pred_cfg, cfg.workload)
        prepare = getattr(predictor, "prepare", None)
        if prepare is not None:
            prepare(requests)
        return np.asarray([predictor.predict(r).median for r in requests], dtype=np.float64)


def _with(workload: Workload, requests: tuple[Request, ...]) -> Workload:
    return replace(workload, requests=requests, stats={**workload.stats, "shed_reference": True})


def best(per_fraction: dict[float, list[ShedRun]]) -> tuple[float, list[float]]:
    """The fraction with the highest mean goodput over seeds (the smaller on a tie)."""
    if not per_fraction:
        raise ValueError("best: no runs")
    means = {f: float(np.mean([r.goodput for r in runs])) for f, runs in per_fraction.items()}
    f = max(sorted(means), key=means.__getitem__)
    return f, [r.goodput for r in per_fraction[f]]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small version (CI)")
    ap.add_argument("--out", default=str(REPO / "results" / "shedding_reference"))
    ap.add_argument(
        "--row",
        action="append",
        default=[],
        metavar="POLICY:KEY",
        help=f"policy (experiments.policy_gain's names) and ranking key {KEYS}; "
        f"default {' '.join(p + ':' + k for p, k in ROWS)}",
    )
    ap.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    ap.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    ap.add_argument("--override", action="append", default=[], help="extra hydra override")
    args = ap.parse_args(argv)
    rows = [_parse_row(r) for r in args.row] or list(ROWS)
    bad = [f for f in args.fractions if not 0 <= f < 1]
    if bad:
        ap.error(f"--fractions must lie in [0, 1), got {bad}")
    plan: Plan = QUICK if args.quick else FULL
    start = time.perf_counter()
    register_configs()
    results: list[dict] = []
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        runner = Runner(plan, args.override, SHED_POLICIES)
        shedder = ShedRunner(runner)
        for policy, key in rows:
            if policy not in runner.policies:
                known = sorted(runner.policies)
                raise ValueError(f"shedding_reference: unknown policy {policy!r}; one of {known}")
            for rate in args.rates:
                per_fraction: dict[float, list[ShedRun]] = {f: [] for f in args.fractions}
                for seed in plan.seeds:
                    for run in shedder.runs(policy, key, rate, seed, args.fractions):
                        per_fraction[run.fraction].append(run)
                f, goods = best(per_fraction)
                results.append(_row(policy, key, rate, per_fraction, f, goods))
                print(_line(results[-1]), flush=True)
    out = {
        "rows": results,
        "setting": {
            "num_requests": plan.num_requests,
            "seeds": list(plan.seeds),
            "fractions": list(args.fractions),
            "overrides": args.override,
        },
        "runs": runner.runs,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    _write(out, Path(args.out))
    return out


def _parse_row(text: str) -> tuple[str, str]:
    policy, sep, key = text.partition(":")
    if not sep or key not in KEYS:
        raise ValueError(f"--row must be POLICY:KEY with KEY in {KEYS}, got {text!r}")
    return policy, key


def _row(policy, key, rate, per_fraction, f, goods) -> dict:  # noqa: ANN001
    none = per_fraction.get(0.0)
    return {
        "policy": policy,
        "key": key,
        "rate": rate,
        "best_fraction": f,
        "goodput": float(np.mean(goods)),
        "goodput_seeds": goods,
        "kept_goodput": float(np.mean([r.kept_goodput for r in per_fraction[f]])),
        "shed_token_steps": float(np.mean([r.shed_token_steps for r in per_fraction[f]])),
        "no_shedding": None if none is None else float(np.mean([r.goodput for r in none])),
        "by_fraction": {
            str(x): float(np.mean([r.goodput for r in runs])) for x, runs in per_fraction.items()
        },
    }


def _line(row: dict) -> str:
    return (
        f"{row['policy']} ({row['key']} sizes) at {row['rate']:g} req/s: best shed "
        f"{row['best_fraction']:.2f} -> goodput {row['goodput']:.3f} "
        f"[{min(row['goodput_seeds']):.3f}, {max(row['goodput_seeds']):.3f}], "
        f"without shedding {row['no_shedding']}"
    )


def _write(out: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "shedding_reference.json").write_text(compact_json.dumps(out, sort_keys=False))
    header = ["policy", "sizes ranked by", "rate (req/s)", "no shedding", "best shed",
              "goodput [seed range]", "kept goodput", "token-steps shed"]  # fmt: skip
    body = []
    for r in out["rows"]:
        no = "" if r["no_shedding"] is None else f"{r['no_shedding']:.3f}"
        body.append([
            r["policy"], r["key"], f"{r['rate']:g}", no, f"{r['best_fraction']:.2f}",
            f"{r['goodput']:.3f} [{min(r['goodput_seeds']):.3f}, {max(r['goodput_seeds']):.3f}]",
            f"{r['kept_goodput']:.3f}", f"{r['shed_token_steps']:.1%}",
        ])  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    (out_dir / "shedding_reference.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
