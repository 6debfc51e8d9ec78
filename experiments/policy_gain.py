"""The headline: Horizon against the strongest baselines, tuned alike, at every load, with CIs.

    python -m experiments.policy_gain [--setting poisson --setting azure ...] [--jobs 2]
        [--quick] [--out DIR]

For each setting of ``experiments.gain_settings`` (default: all three), every row (policy) and
every seed of the plan:

1. ``rate_at_90``: the highest mean arrival rate at which lifetime goodput (TTFT <= 1 s and every
   ITL <= 50 ms) stays >= 0.9 on that seed, by bisection in [lo, hi];
2. at ``LOAD_FRACTIONS`` x the best row's mean rate_at_90 (light load to 1.3x): goodput,
   throughput, p99 TTFT and ITL, preemptions, recompute waste and the longest queue wait.

Means over seeds with 95% t intervals (``experiments.gain_stats``). The strongest baseline is the
row, neither Horizon nor an oracle, with the highest mean rate_at_90; at each load, the one with
the highest mean goodput there. Ratios are per seed (the same requests under both policies).
The baselines with knobs run with the settings ``experiments.policy_tuning`` chose on another
seed (``configs/policy/tuned/``).

Each setting's figures go to ``<out>/settings/<setting>.json``; then the settings files there
give ``<out>/policy_gain.json`` (the headline keys), ``policy_gain.md`` and the figures. The
LAST line printed is one JSON object: the first setting's (``poisson`` when present)
``rate_at_90``, ``rate_at_90_ci``, ``strongest_baseline``, ``gain_vs_strongest`` and
``learned_vs_mean``, and every setting's under ``settings``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from hydra import initialize_config_dir

from experiments.config import RunConfig
from experiments.config_store import register_configs
from experiments.errors import ConfigError
from experiments.gain_runner import METRICS, Plan, SeedResult, SeedTask, compose_run, run_tasks
from experiments.gain_settings import SETTINGS, rows_of
from experiments.gain_summary import summarise

REPO = Path(__file__).resolve().parents[1]
LOAD_FRACTIONS = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3)
EVAL_SEEDS = (0, 1, 2, 3, 4)
FULL = Plan(num_requests=4000, seeds=EVAL_SEEDS, iterations=8, lo=10.0, hi=170.0)
QUICK = Plan(num_requests=300, seeds=(0, 1), iterations=3, lo=10.0, hi=170.0)
QUICK_ROWS = ("fcfs", "sglang", "horizon_mean", "horizon_oracle")  # no training in CI


def measure(setting: str, plan: Plan, jobs: int, extra: list[str], only=None) -> dict:  # noqa: ANN001
    """Both steps for every row of ``setting`` on every seed: the setting's summary."""
    start = time.perf_counter()
    rows = {r: o for r, o in rows_of(setting).items() if only is None or r in only}
    cfgs = compose_rows(setting, rows, extra)
    tasks = [SeedTask(row, cfgs[row], s, plan) for row in cfgs for s in plan.seeds]
    bisected = run_tasks(tasks, jobs)
    rate90 = {row: _by_seed(bisected, row, plan, lambda r: r.rate_at_90) for row in rows}
    best = max(sum(v) / len(v) for v in rate90.values())
    loads = tuple(round(f * best, 1) for f in LOAD_FRACTIONS)
    grid = run_tasks([replace(t, loads=loads) for t in tasks], jobs)
    at_load = {m: {row: _per_load(grid, row, plan, loads, m) for row in rows} for m in METRICS}
    runs = sum(r.runs for r in bisected + grid)
    return summarise(
        setting, rate90, loads, at_load, _conditions(cfgs, plan, extra), runs,
        time.perf_counter() - start,
    )  # fmt: skip


def compose_rows(
    setting: str, rows: dict[str, list[str]], extra: list[str]
) -> dict[str, RunConfig]:
    """Each row's run config in ``setting`` (rate and seed: the defaults; tasks set them)."""
    missing = [o for ov in rows.values() for o in ov if o.startswith("policy=tuned/")]
    tuned = REPO / "configs" / "policy"
    absent = [o for o in missing if not (tuned / f"{o.removeprefix('policy=')}.yaml").exists()]
    if absent:
        raise ConfigError("policy", absent[0], "no such config: run experiments.policy_tuning")
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return {row: compose_run([*SETTINGS[setting], *extra, *ov]) for row, ov in rows.items()}


def _by_seed(results: list[SeedResult], row: str, plan: Plan, get) -> list[float]:  # noqa: ANN001
    got = {r.seed: get(r) for r in results if r.row == row}
    return [float(got[s]) for s in plan.seeds]


def _per_load(results: list[SeedResult], row: str, plan: Plan, loads, metric: str) -> list:  # noqa: ANN001
    """Per load, the row's ``metric`` on every seed."""
    return [_by_seed(results, row, plan, lambda r, x=x: r.at[x][metric]) for x in loads]


def _conditions(cfgs: dict[str, RunConfig], plan: Plan, extra: list[str]) -> dict:
    cfg = next(iter(cfgs.values()))
    w = cfg.workload
    return {
        "backend": "simulator",
        "model": cfg.model.shape,
        "gpu": cfg.model.gpu,
        "cost_model": cfg.backend.cost_model,
        "num_blocks": cfg.model.num_blocks,
        "workload": f"{w.name} ({w.conversations} conversations)",
        "arrival": w.arrival,
        "slo": cfg.slo.name,
        "goodput": "lifetime (TTFT <= 1 s and every ITL <= 50 ms)",
        "num_requests": plan.num_requests,
        "seeds": list(plan.seeds),
        "bisection": {"iterations": plan.iterations, "lo": plan.lo, "hi": plan.hi},
        "load_fractions": list(LOAD_FRACTIONS),
        "interval": "95% Student t over seeds; ratios per seed",
        "overrides": list(extra),
        "policies": {row: c.policy.label for row, c in cfgs.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", action="append", choices=list(SETTINGS), default=None)
    ap.add_argument("--quick", action="store_true", help="CI-sized: 300 requests, 2 seeds, 4 rows")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", default=str(REPO / "results" / "policy_gain"))
    ap.add_argument("--override", action="append", default=[], help="extra hydra override")
    args = ap.parse_args(argv)
    plan, only = (QUICK, QUICK_ROWS) if args.quick else (FULL, None)
    out = Path(args.out)
    (out / "settings").mkdir(parents=True, exist_ok=True)
    for setting in args.setting or list(SETTINGS):
        result = measure(setting, plan, args.jobs, args.override, only)
        (out / "settings" / f"{setting}.json").write_text(json.dumps(result, separators=(",", ":")))
    from experiments.gain_report import write_report

    combined = write_report(out)
    print(json.dumps(combined["headline"]))
    return combined


if __name__ == "__main__":
    main()
