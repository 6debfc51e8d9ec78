"""The headline comparison: how much goodput Horizon gains over the baselines under KV pressure.

    python -m experiments.policy_gain [--quick] [--no-triage-row] [--out DIR]

Setting: the Qwen2.5-7B shape on one H200 (the default cost model: the one fitted to the
engine's online 7B steps; ``--override backend=sim`` for the analytic roofline), the
KV-bound pool of the main sweep (3,000 blocks), ShareGPT first turns from the half of the
conversations held out of the learned predictor's training split, Poisson arrivals, SLO preset
``h200_7b`` (TTFT 1 s, ITL 50 ms), lifetime goodput. Steps:

1. ``load``: bisect the arrival rate until fcfs's lifetime goodput (mean over seeds) is ~0.5
   (past the plan's 0.7 req/s steps, finer ones until it is within 0.03 above 0.5: near
   saturation fcfs falls off a cliff);
2. run every policy there, on every seed: goodput, throughput, p99 TTFT, recompute waste, the
   longest queue wait;
3. ``rate_at_90``: for each policy, bisect the highest rate whose mean goodput is >= 0.9.

Prints a table, writes ``policy_gain.json`` and ``policy_gain.md`` into ``--out``, and prints
as its LAST line one JSON object: load, goodput, throughput, p99_ttft, rate_at_90,
recompute_waste (per policy, means over seeds) and their seed spreads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tqdm import tqdm

from experiments.components import build_components
from experiments.config import RunConfig
from experiments.config_store import register_configs
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload

REPO = Path(__file__).resolve().parents[1]
SETTING = [
    "workload.conversations=held_out",
    "workload.split_test_fraction=0.5",
    "model.num_blocks=3000",
    "slo=h200_7b",
]
POLICIES: dict[str, list[str]] = {
    "fcfs": ["policy=fcfs"],
    "memory_first": ["policy=memory_first"],
    "sjf_prompt": ["policy=sjf_prompt"],
    "horizon_learned": ["policy=horizon"],
    "horizon_mean": ["policy=horizon_mean"],
    "horizon_oracle": ["policy=horizon_oracle"],
    "oracle_srpt": ["policy=oracle_srpt"],
}
# --no-triage-row: Horizon without triage beside it (another learned-predictor row, ~5 min)
NO_TRIAGE = ("horizon_no_triage", ["policy=horizon_no_triage"])
METRICS = (
    "goodput_lifetime",
    "throughput_tok_s",
    "ttft_p99",
    "recompute_waste",
    "queue_wait_max",
    "preemptions",
    "itl_p99",
)


@dataclass(frozen=True)
class Plan:
    num_requests: int
    seeds: tuple[int, ...]
    iterations: int  # bisection steps
    lo: float
    hi: float
    # ``load`` only: up to this many more steps while fcfs's goodput at the rate found is more
    # than LOAD_TOLERANCE above 0.5 (near saturation it falls off a cliff within one step)
    refine: int = 0


LOAD_TOLERANCE = 0.03
FULL = Plan(num_requests=4000, seeds=(0, 1, 2), iterations=8, lo=20.0, hi=200.0, refine=6)
QUICK = Plan(num_requests=600, seeds=(0,), iterations=5, lo=20.0, hi=200.0)


class Runner:
    """Runs (policy, rate) over the plan's seeds, reusing loaded data and workloads."""

    def __init__(
        self, plan: Plan, extra: list[str], policies: dict[str, list[str]] | None = None
    ) -> None:
        self.plan, self.extra = plan, extra
        self.policies = POLICIES if policies is None else policies
        self.sources: DataSources | None = None
        self._workloads: dict[tuple[float, int], object] = {}
        self.runs = 0
        # bisections: the number of runs is not known ahead, so a counter with its rate
        self.progress = tqdm(desc="simulated runs", unit="run", disable=None, file=sys.stderr)

    def config(self, policy: str, rate: float, seed: int) -> RunConfig:
        overrides = [
            *SETTING,
            *self.extra,
            *self.policies[policy],
            f"rate={rate}",
            f"seed={seed}",
            f"num_requests={self.plan.num_requests}",
        ]
        cfg = OmegaConf.to_object(compose("run", overrides=overrides))
        assert isinstance(cfg, RunConfig)
        return cfg

    def metrics(self, policy: str, rate: float) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {m: [] for m in METRICS}
        for seed in self.plan.seeds:
            cfg = self.config(policy, rate, seed)
            if self.sources is None:
                self.sources = DataSources(cfg.data)
            key = (rate, seed)
            if key not in self._workloads:
                self._workloads[key] = make_workload(cfg, self.sources)
            parts = build_components(cfg, self.sources)
            result = simulate(cfg, self._workloads[key], parts)
            self.runs += 1
            self.progress.update()
            for m in METRICS:
                out[m].append(float(result.metrics[m]))
        return out


def bisect_rate(
    goodput_at: Callable[[float], float],
    target: float,
    plan: Plan,
    tolerance: float | None = None,
) -> float:
    """Highest rate in [lo, hi] (to the plan's precision) whose goodput is >= ``target``.

    With ``tolerance``: after the plan's steps, up to ``plan.refine`` more while the goodput at
    the rate found exceeds ``target + tolerance`` (rates are kept to 0.01 req/s).
    """
    lo, hi = plan.lo, plan.hi
    if goodput_at(lo) < target:
        return lo
    if goodput_at(hi) >= target:
        return hi
    steps = plan.iterations + (plan.refine if tolerance is not None else 0)
    for i in range(steps):
        if i >= plan.iterations and goodput_at(lo) <= target + tolerance:
            break
        mid = round((lo + hi) / 2, 2)
        if mid in (lo, hi):
            break
        if goodput_at(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small version (CI)")
    ap.add_argument("--out", default=str(REPO / "results" / "policy_gain"))
    ap.add_argument("--override", action="append", default=[], help="extra hydra override")
    ap.add_argument(
        "--no-triage-row",
        action="store_true",
        help="also run horizon without triage (the ablation of its queue triage; ~5 min more)",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    policies = dict(POLICIES)
    if args.no_triage_row:  # right after horizon_learned, for the table
        items = list(policies.items())
        at_ = [k for k, _ in items].index("horizon_learned") + 1
        policies = dict(items[:at_] + [NO_TRIAGE] + items[at_:])
    start = time.perf_counter()
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        runner = Runner(plan, args.override, policies)
        memo: dict[tuple[str, float], dict[str, list[float]]] = {}

        def at(policy: str, rate: float) -> dict[str, list[float]]:
            if (policy, rate) not in memo:
                memo[(policy, rate)] = runner.metrics(policy, rate)
            return memo[(policy, rate)]

        def mean_goodput(policy: str) -> Callable[[float], float]:
            return lambda rate: float(np.mean(at(policy, rate)["goodput_lifetime"]))

        load = bisect_rate(mean_goodput("fcfs"), 0.5, plan, LOAD_TOLERANCE)
        print(f"load where fcfs keeps ~50% lifetime goodput: {load:g} req/s", flush=True)
        table = {p: at(p, load) for p in policies}
        rate90 = {p: bisect_rate(mean_goodput(p), 0.9, plan) for p in policies}
        cfg = runner.config("fcfs", load, plan.seeds[0])
    out = _summary(
        load, table, rate90, plan, runner.runs, time.perf_counter() - start, cfg, args.override
    )
    _write(out, Path(args.out))
    print(json.dumps(out))
    return out


def _summary(load, table, rate90, plan, runs, wall, cfg: RunConfig, extra: list[str]) -> dict:  # noqa: ANN001
    def mean(p: str, m: str) -> float:
        return round(float(np.mean(table[p][m])), 4)

    def spread(p: str, m: str) -> list[float]:
        return [round(float(np.min(table[p][m])), 4), round(float(np.max(table[p][m])), 4)]

    out = {
        "load": load,
        "goodput": {p: mean(p, "goodput_lifetime") for p in table},
        "throughput": {p: mean(p, "throughput_tok_s") for p in table},
        "p99_ttft": {p: mean(p, "ttft_p99") for p in table},
        "rate_at_90": rate90,
        "recompute_waste": {p: mean(p, "recompute_waste") for p in table},
        "max_queue_wait": {p: mean(p, "queue_wait_max") for p in table},
        "p99_itl": {p: mean(p, "itl_p99") for p in table},
        "preemptions": {p: mean(p, "preemptions") for p in table},
        "goodput_spread": {p: spread(p, "goodput_lifetime") for p in table},
        "throughput_spread": {p: spread(p, "throughput_tok_s") for p in table},
        "p99_ttft_spread": {p: spread(p, "ttft_p99") for p in table},
        "goodput_kind": "lifetime (TTFT <= 1 s and every ITL <= 50 ms)",
        "setting": {  # as the runs resolved it (--override included)
            "model": cfg.model.shape,
            "gpu": "H200",
            "cost_model": cfg.backend.cost_model,
            "cost_model_options": dict(cfg.backend.cost_model_options),
            "num_blocks": cfg.model.num_blocks,
            "workload": f"{cfg.workload.name} ({cfg.workload.conversations} conversations)",
            "slo": cfg.slo.name,
            "overrides": list(extra),
            "num_requests": plan.num_requests,
            "seeds": list(plan.seeds),
            "bisection_iterations": plan.iterations,
            "load_refine": {"steps": plan.refine, "tolerance": LOAD_TOLERANCE},
        },
        "runs": runs,
        "wall_s": round(wall, 1),
    }
    f, h = out["goodput"]["fcfs"], out["goodput"]["horizon_learned"]
    out["ratios"] = {
        "goodput_vs_fcfs": round(h / f, 3) if f else None,
        "goodput_vs_sjf_prompt": round(h / out["goodput"]["sjf_prompt"], 3)
        if out["goodput"]["sjf_prompt"]
        else None,
        "goodput_vs_horizon_oracle": round(h / out["goodput"]["horizon_oracle"], 3)
        if out["goodput"]["horizon_oracle"]
        else None,
        "throughput_vs_fcfs": round(
            out["throughput"]["horizon_learned"] / out["throughput"]["fcfs"], 3
        ),
        "rate_at_90_vs_fcfs": round(rate90["horizon_learned"] / rate90["fcfs"], 3)
        if rate90["fcfs"]
        else None,
    }
    return out


def _write(out: dict, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / "policy_gain.json").write_text(json.dumps(out, indent=1))
    lines = [
        f"At {out['load']:g} req/s (fcfs lifetime goodput ~0.5); means over seeds "
        f"{out['setting']['seeds']} with [min, max]. Cost model: "
        f"{out['setting']['cost_model']} ({out['setting']['model']}).",
        "",
        "| policy | lifetime goodput | throughput (tok/s) | p99 TTFT (s) | recompute waste "
        "| max queue wait (s) | rate at 90% goodput (req/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in out["goodput"]:
        g, gs = out["goodput"][p], out["goodput_spread"][p]
        lines.append(
            f"| {p} | {g:.3f} [{gs[0]:.3f}, {gs[1]:.3f}] | {out['throughput'][p]:.0f} | "
            f"{out['p99_ttft'][p]:.2f} | {out['recompute_waste'][p]:.3f} | "
            f"{out['max_queue_wait'][p]:.1f} | {out['rate_at_90'][p]:g} |"
        )
    text = "\n".join(lines) + "\n"
    (where / "policy_gain.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
