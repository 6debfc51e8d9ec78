"""Simulator speed benchmark: 10,000 ShareGPT first-turn requests, Poisson arrivals at ~90% of
the 7B shape's capacity on one H200 (roofline cost model), fcfs, one core.

    python -m experiments.bench_sim [--requests N] [--load 0.9] [--mode event|reference]
        [--cost-model roofline|engine_fitted] [--speculation K [--alpha 0.7]]

``--cost-model engine_fitted``: the configs' default, fitted to the engine's online 7B steps,
with the engine's loop (``backend=sim_engine``: a step planned while the previous one runs,
arrivals queued between steps). ``--speculation K``: every decoding request verifies ``K``
n-gram drafts per step (``fixed`` policy), each accepted with probability ``--alpha`` given
the ones before it (``horizon.acceptance``, seeded); the load is then a fraction of the
speculating engine's own measured capacity. The scheduler draws those acceptances ahead
(``horizon.drawn_speculation``), so speculating steps stay event-driven.

Capacity is measured, not assumed: a saturated probe (every request at t=0) gives the
completed requests per simulated second. The same run is timed ``--repeat`` times (fresh
requests each time, identical records) and ``wall_s`` is the median. The timed part is the
simulation itself (scheduler, SimPy, records), not loading or tokenising data. Prints a table,
then as its LAST line one JSON
object: requests, simulated_s, wall_s, speedup (= simulated_s / wall_s), requests_per_s
(= requests / wall_s), plus the setting.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from horizon.acceptance import AcceptanceModel
from horizon.metrics.records import RunRecords
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.scheduler_config import SchedulerConfig
from horizon.speculation import SpeculationConfig
from horizon.workload import WorkloadConfig, build_workload, load_sharegpt, tokenize_corpus
from simulator import Simulation, gpu_spec, make_cost_model

REPO = Path(__file__).resolve().parents[1]


def _run(requests, config, policy, cost_model, engine_loop, alpha) -> tuple[object, float]:  # noqa: ANN001
    acceptance = None
    if config.speculation is not None:
        acceptance = AcceptanceModel.geometric(alpha, seed=0)
    t0 = time.perf_counter()
    rec = Simulation(
        requests,
        config,
        make_policy(policy),
        cost_model,
        pipelined=engine_loop,
        arrivals_at_step_boundaries=engine_loop,
        acceptance=acceptance,
    ).run()
    return rec, time.perf_counter() - t0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--load", type=float, default=0.9, help="fraction of measured capacity")
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--mode", default="event", choices=["event", "reference"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs; wall_s is their median")
    ap.add_argument("--cache", default=str(REPO / "data" / "cache" / "sharegpt_qwen2.npz"))
    ap.add_argument("--cost-model", default="roofline", choices=["roofline", "engine_fitted"])
    ap.add_argument("--speculation", type=int, default=0, help="draft tokens per step (0: off)")
    ap.add_argument("--alpha", type=float, default=0.7, help="stated acceptance per draft")
    args = ap.parse_args(argv)
    if args.speculation < 0 or not 0.0 <= args.alpha <= 1.0:
        ap.error("--speculation must be >= 0 and --alpha in [0, 1]")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    shape, gpu = model_shape("qwen2.5-7b"), gpu_spec("H200")
    engine_loop = args.cost_model == "engine_fitted"
    options = {"path": str(REPO / "calibration" / "h200_qwen2.5-7b_online.csv.gz")}
    cost_model = make_cost_model(
        args.cost_model, shape=shape, gpu=gpu, **(options if engine_loop else {})
    )
    spec = None
    if args.speculation:
        spec = SpeculationConfig(policy="fixed", num_draft_tokens=args.speculation)
    config = SchedulerConfig(
        num_blocks=shape.kv_blocks(gpu.memory_bytes, 0.9, 16), step_mode=args.mode,
        speculation=spec,
    )  # fmt: skip
    tokenized = tokenize_corpus(load_sharegpt(), args.cache)

    def workload(rate: float, n: int):  # noqa: ANN202
        wc = WorkloadConfig(num_requests=n, rate=rate, seed=args.seed)
        return build_workload(wc, tokenized)

    probe = workload(1.0, 2000).new_requests()
    for r in probe:
        r.arrival_time = 0.0
    rec, _ = _run(probe, config, args.policy, cost_model, engine_loop, args.alpha)
    capacity = 2000 / float(rec.step_end[-1])
    rate = args.load * capacity

    timed = workload(rate, args.requests)
    walls = []
    for _ in range(max(1, args.repeat)):
        rec, w = _run(
            timed.new_requests(), config, args.policy, cost_model, engine_loop, args.alpha
        )
        walls.append(w)
    out = _result(args, rec, walls, capacity, rate)
    out.update(model=shape.name, gpu=gpu.name, num_blocks=config.num_blocks)
    _print(out)
    return out


def _result(
    args: argparse.Namespace, rec: RunRecords, walls: list[float], capacity: float, rate: float
) -> dict:
    """The JSON line's figures: the last timed run's records, the median of the walls."""
    wall = float(np.median(walls))
    simulated = float(rec.step_end[-1])
    return {
        "requests": args.requests,
        "simulated_s": round(simulated, 3),
        "wall_s": round(wall, 4),
        "speedup": round(simulated / wall, 1),
        "requests_per_s": round(args.requests / wall, 1),
        "wall_s_runs": [round(w, 4) for w in walls],
        "steps": int(len(rec.step_end)),
        "steps_per_s": round(len(rec.step_end) / wall, 1),
        "tokens": int(rec.num_output_tokens.sum()),
        "capacity_req_s": round(capacity, 2),
        "rate_req_s": round(rate, 2),
        "mean_running": round(float(np.mean(rec.num_running)), 1),
        "policy": args.policy,
        "mode": args.mode,
        "cost_model": args.cost_model,
        "speculation": args.speculation,
        "alpha": args.alpha if args.speculation else None,
    }


def _print(out: dict) -> None:
    """The table, then the JSON object as the last line."""
    print(
        f"{'requests':>10} {'simulated s':>12} {'wall s':>8} {'speedup':>9} {'req/s':>9} "
        f"{'steps':>7} {'capacity':>9}"
    )
    print(
        f"{out['requests']:>10} {out['simulated_s']:>12} {out['wall_s']:>8} "
        f"{out['speedup']:>9} {out['requests_per_s']:>9} {out['steps']:>7} "
        f"{out['capacity_req_s']:>9}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
