"""Cluster simulator speed benchmark: 16 replicas of the 7B shape on H200s (engine-fitted cost
model, the engine's pipelined loop), ShareGPT first turns with Poisson arrivals at 90% of 16
times one replica's measured capacity, 100,000 requests, ``least_loaded``, one core.

    python -m experiments.bench_cluster [--router NAME] [--replicas 16] [--requests 100000]
        [--load 0.9] [--repeat 1] [--view-delay 0] [--prefill 0] [--per-gpu 1 --sharing quantum]

``--prefill P``: disaggregated, P prefill replicas and the rest decode replicas (decode router
``least_kv``, KV over NVLink), the load still 90% of N times one mixed replica's capacity.
``--per-gpu K``: K replicas share each simulated GPU under ``--sharing`` (``fcfs``,
``timeslice`` or ``quantum``, slice ``--quantum-s``; ``simulator.device_sharing``), the load
then 90% of N / K times one replica's capacity.

The packaged ShareGPT corpus holds fewer usable first turns than 100,000: requests are drawn
from them with replacement (seeded), so equal prompts recur and a prefix-aware router finds
hits. Capacity is measured as bench_sim's: a saturated single-replica probe (2,000 requests at
t = 0). The timed part is the cluster simulation (routing, schedulers, SimPy, records), not
loading data; ``cpu_s`` is the same runs' process CPU time, which other processes sharing the
core do not inflate. Prints a table, then as its LAST line one JSON object: replicas, router,
requests, simulated_s, wall_s, requests_per_s, plus the setting.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from experiments.bench_sim import REPO
from horizon.cluster import make_router
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import WorkloadConfig, load_sharegpt, tokenize_corpus
from horizon.workload.arrivals import poisson
from horizon.workload.filters import FilterTally, LengthFilter
from horizon.workload.turns import RequestSpec, conversation_requests
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup

CALIBRATION = REPO / "calibration" / "h200_qwen2.5-7b_online.csv.gz"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--router", default="least_loaded")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.9, help="fraction of N x one's capacity")
    ap.add_argument("--view-delay", type=float, default=0.0, help="stale views, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill", type=int, default=0, help="prefill replicas (0: all mixed)")
    ap.add_argument("--per-gpu", type=int, default=1, help="replicas sharing each GPU")
    ap.add_argument("--sharing", default="quantum", help="the shared GPUs' rule (--per-gpu > 1)")
    ap.add_argument("--quantum-s", type=float, default=0.00025, help="the quantum rule's slice")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs; wall_s is their median")
    ap.add_argument("--cache", default=str(REPO / "data" / "cache" / "sharegpt_qwen2.npz"))
    return ap.parse_args(argv)


def _pool(cache: str) -> list[RequestSpec]:
    """Every usable ShareGPT first turn of the packaged corpus (the default length filters)."""
    tokenized = tokenize_corpus(load_sharegpt(), cache)
    limits, tally = LengthFilter.from_config(WorkloadConfig()), FilterTally()
    specs = []
    for c in range(tokenized.num_conversations):
        specs.extend(conversation_requests(tokenized, c, limits, tally, max_turns=1))
    return specs


def _requests(pool: list[RequestSpec], n: int, rate: float, seed: int) -> list[Request]:
    """``n`` requests drawn from ``pool`` with replacement, Poisson arrivals at ``rate``; each
    draw is its own conversation (a sticky router routes it once)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(pool), n)
    times = poisson(rate, n, rng)
    cap = WorkloadConfig().max_output_tokens
    return [
        Request(
            i,
            t,
            pool[k].num_prompt_tokens,
            cap,
            pool[k].output_tokens,
            prompt_token_ids=pool[k].prompt_token_ids,
            conversation_id=i,
        )  # fmt: skip
        for i, (k, t) in enumerate(zip(picks.tolist(), times.tolist()))
    ]


def _capacity(pool: list[RequestSpec], config: SchedulerConfig, cost_model) -> float:  # noqa: ANN001
    """Completed requests per simulated second of one replica with 2,000 requests at t = 0."""
    probe = _requests(pool, 2000, 1.0, seed=12345)
    for r in probe:
        r.arrival_time = 0.0
    rec = Simulation(probe, config, make_policy("fcfs"), cost_model, pipelined=True,
                     arrivals_at_step_boundaries=True).run()  # fmt: skip
    return 2000 / float(rec.step_end[-1])


def _device(args, i: int):  # noqa: ANN001, ANN202 - a DeviceSpec or None
    """Replica ``i``'s shared GPU under ``--per-gpu`` (None: a GPU of its own)."""
    from simulator.device_sharing import DeviceSpec

    if args.per_gpu <= 1:
        return None
    quantum = args.quantum_s if args.sharing == "quantum" else None
    return DeviceSpec(f"gpu{i // args.per_gpu}", args.sharing, quantum_s=quantum)


def _run(args, requests, config, cost_model) -> tuple[object, float, float]:  # noqa: ANN001
    from simulator.kv_link import link_spec

    p = args.prefill
    roles = ["prefill"] * p + ["decode"] * (args.replicas - p) if p else ["mixed"] * args.replicas
    shape = model_shape("qwen2.5-7b")
    setups = [
        ReplicaSetup(
            config, make_policy("fcfs"), cost_model, shape, role=role, device=_device(args, i)
        )
        for i, role in enumerate(roles)
    ]
    sim = ClusterSimulation(
        requests,
        setups,
        make_router(args.router),
        view_delay=args.view_delay,
        pipelined=True,
        arrivals_at_step_boundaries=True,
        decode_router=make_router("least_kv") if p else None,
        kv_link=link_spec("nvlink") if p else None,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    rec = sim.run()
    return rec, time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    shape, gpu = model_shape("qwen2.5-7b"), gpu_spec("H200")
    cost_model = make_cost_model("engine_fitted", shape=shape, gpu=gpu, path=str(CALIBRATION))
    config = SchedulerConfig(num_blocks=shape.kv_blocks(gpu.memory_bytes, 0.9, 16))
    pool = _pool(args.cache)
    capacity = _capacity(pool, config, cost_model)
    rate = args.load * args.replicas * capacity / max(1, args.per_gpu)
    walls, cpus = [], []
    for _ in range(max(1, args.repeat)):
        requests = _requests(pool, args.requests, rate, args.seed)
        rec, wall, cpu = _run(args, requests, config, cost_model)
        walls.append(wall)
        cpus.append(cpu)
    out = _result(args, rec, walls, capacity, rate, len(pool))
    out["cpu_s"] = round(float(np.median(cpus)), 3)  # the process's CPU time: contention-free
    _print(out)
    return out


def _result(args, rec, walls, capacity, rate, pool_size) -> dict:  # noqa: ANN001
    from horizon.cluster.metrics import imbalance, prefix_hit_rate

    wall = float(np.median(walls))
    simulated = max(float(r.step_end[-1]) for r in rec.replicas if len(r.step_end))
    steps = sum(len(r.step_end) for r in rec.replicas)
    return {
        "replicas": args.replicas,
        "router": args.router,
        "prefill_replicas": args.prefill,
        "per_gpu": args.per_gpu,
        "sharing": args.sharing if args.per_gpu > 1 else None,
        "requests": args.requests,
        "simulated_s": round(simulated, 3),
        "wall_s": round(wall, 3),
        "requests_per_s": round(args.requests / wall, 1),
        "wall_s_runs": [round(w, 3) for w in walls],
        "steps": steps,
        "route_wall_s": round(rec.route_wall_s, 3),
        "capacity_req_s_per_replica": round(capacity, 2),
        "rate_req_s": round(rate, 2),
        "view_delay_s": args.view_delay,
        "imbalance_max_over_mean": round(imbalance(rec)["max_over_mean"], 4),
        "prefix_hit_rate": round(prefix_hit_rate(rec), 4),
        "distinct_prompts": pool_size,
        "model": "qwen2.5-7b",
        "gpu": "H200",
        "cost_model": "engine_fitted",
    }


def _print(out: dict) -> None:
    """The table, then the JSON object as the last line."""
    cols = ("replicas", "router", "requests", "simulated_s", "wall_s", "requests_per_s")
    print(" ".join(f"{c:>14}" for c in cols))
    print(" ".join(f"{out[c]!s:>14}" for c in cols))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
