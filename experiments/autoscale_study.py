"""The autoscaling study: reactive, predictive and conservative autoscalers against a fleet that
is always fully provisioned, across load patterns and replica start-up delays.

    python -m experiments.autoscale_study [--jobs 2] [--quick] [--out results/autoscale]

Setting (simulated): up to 6 replicas of the Qwen2.5-7B shape on H200s (3,000 blocks, fcfs,
the engine-fitted cost model, the engine's loop), least-loaded routing, 1 replica at time 0,
a decision every 10 s. Start-up delays: the 7B replica's cold start measured on the H200
(``calibration/h200_cold_start.json``, 24.2 s) and that x2 and x5 (larger models, slower
storage: an extrapolation). Load patterns over 120 s of ShareGPT first turns (drawn with
replacement): a step (20 -> 120 -> 20 req/s), a spike (30 req/s with 180 req/s for 20 s) and
the Azure conversation trace's arrivals (10 s bins) scaled to 60 req/s. Autoscalers at their
defaults, sized by one measurement of one replica: 50 req/s near its goodput knee
(predictive's capacity) and the requests it holds at that rate (reactive's and
conservative's per-replica target); ``static`` holds all 6. Seeds 0-2. Judged by goodput
(TTFT 1 s, ITL 50 ms) and GPU-seconds. Writes ``<out>/autoscale.json``: every run, then
means with 95% t intervals per row, pattern and delay.
"""

from __future__ import annotations

import argparse
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments.cluster_setup import ReplicaSpec
from experiments.gain_stats import mean_ci
from horizon.cluster import Autoscaler, make_autoscaler, make_router
from horizon.request import SLO

REPO = Path(__file__).resolve().parents[1]
TOKENS = REPO / "data" / "cache" / "sharegpt_qwen2.5.npz"
TRACE = REPO.parent / "shared" / "data" / "AzureLLMInferenceTrace_conv.csv.gz"
COLD_START = REPO / "calibration" / "h200_cold_start.json"
MAX_REPLICAS, INITIAL, INTERVAL_S, DURATION_S = 6, 1, 10.0, 120.0
CAPACITY = 50.0  # req/s per replica near its goodput knee (the cluster studies' first turns)
ROWS = ("reactive", "predictive", "conservative", "static")
PATTERNS = ("step", "spike", "azure_conv")
DELAY_FACTORS = (1.0, 2.0, 5.0)
SEEDS = (0, 1, 2)
SLO_TTFT, SLO_ITL = 1.0, 0.05


class Static(Autoscaler):
    """Every replica provisioned all along (the baseline)."""

    name = "static"

    def decide(self, view):  # noqa: ANN001, ANN201
        return view.max_replicas


@dataclass(frozen=True)
class Task:
    row: str
    pattern: str
    factor: float
    seed: int
    duration: float = DURATION_S
    per_replica: float = 32.0  # requests in a replica at CAPACITY (reactive's target)


def arrival_times(pattern: str, duration: float, seed: int) -> np.ndarray:
    from horizon.workload import patterns
    from horizon.workload.azure_trace import load_azure_trace

    rng = np.random.default_rng(seed)
    if pattern == "step":
        return patterns.arrivals(patterns.step([20, 120, 20], duration / 3), duration, rng)
    if pattern == "spike":
        spike = patterns.spike(30.0, 180.0, duration / 2, 20.0)
        return patterns.arrivals(spike, duration, rng)
    times = load_azure_trace(TRACE).times
    shape = patterns.from_trace(times, 10.0, scale=60.0 / (len(times) / times[-1]))
    return patterns.arrivals(shape, duration, rng)


def startup_delay(factor: float) -> float:
    from simulator.startup_model import StartupModel

    return StartupModel.load(COLD_START).delay("qwen2.5-7b") * factor


_POOL: list = []


def requests_of(task: Task) -> list:
    """Held-out ShareGPT first turns drawn with replacement (seeded), at the pattern's times."""
    from horizon.request import Request
    from horizon.workload import WorkloadConfig, build_workload, load_sharegpt, tokenize_corpus

    if not _POOL:
        cfg = WorkloadConfig(num_requests=5000, conversations="held_out", split_test_fraction=0.5)
        _POOL.extend(build_workload(cfg, tokenize_corpus(load_sharegpt(), TOKENS)).requests)
    times = np.sort(arrival_times(task.pattern, task.duration, task.seed))
    picks = np.random.default_rng(task.seed + 1000).integers(0, len(_POOL), len(times))
    return [
        Request(
            i,
            t,
            q.num_prompt_tokens,
            q.max_output_tokens,
            q.true_output_tokens,
            prompt_token_ids=q.prompt_token_ids,
        )  # fmt: skip
        for i, (t, q) in enumerate(zip(times.tolist(), (_POOL[k] for k in picks.tolist())))
    ]


def run_task(task: Task) -> dict:
    from horizon.metrics import summarize
    from simulator.autoscaling import AutoscaleConfig
    from simulator.cluster_simulation import ClusterSimulation

    requests = requests_of(task)
    cache: dict = {}
    setups = [ReplicaSpec(num_blocks=3000).setup(None, cache) for _ in range(MAX_REPLICAS)]
    scaler = make_scaler(task)
    static = task.row == "static"
    delay = startup_delay(task.factor)
    rec = ClusterSimulation(
        requests, setups, make_router("least_loaded"),
        pipelined=True, arrivals_at_step_boundaries=True, autoscaler=scaler,
        autoscale=AutoscaleConfig(INTERVAL_S, delay, 1, MAX_REPLICAS if static else INITIAL),
    ).run()  # fmt: skip
    m = summarize(rec.merged(), slo=SLO(SLO_TTFT, SLO_ITL))
    return {
        "row": task.row, "pattern": task.pattern, "delay_s": delay, "factor": task.factor,
        "seed": task.seed, "requests": len(requests), "goodput": m["goodput_lifetime"],
        "ttft_p99": m["ttft_p99"], "itl_p99": m["itl_p99"],
        "gpu_seconds": rec.fleet["gpu_seconds"],
        "peak_replicas": max(row[1] + row[2] for row in rec.fleet["timeline"]),
    }  # fmt: skip


def make_scaler(task: Task) -> Autoscaler:
    """Every autoscaler at its defaults, sized by the same measurement of one replica: its rate
    near the knee (predictive) and the requests it holds there (reactive's per-replica
    target, by Little's law from a one-replica run at that rate)."""
    if task.row == "static":
        return Static()
    if task.row == "predictive":
        return make_autoscaler("predictive", per_replica_capacity=CAPACITY)
    return make_autoscaler(task.row, target_per_replica=task.per_replica)


def per_replica_concurrency(seed: int = 0) -> float:
    """Mean requests held (running plus waiting, over steps) by one replica at CAPACITY."""
    from simulator.cluster_simulation import ClusterSimulation

    task = Task("static", "step", 1.0, seed, 60.0)
    reqs = [r for r in requests_of(task)]
    rng = np.random.default_rng(seed)
    for r, t in zip(reqs, np.cumsum(rng.exponential(1 / CAPACITY, len(reqs))).tolist()):
        r.arrival_time = t
    setup = ReplicaSpec(num_blocks=3000).setup(None, {})
    rec = ClusterSimulation(reqs[: int(60 * CAPACITY)], [setup], make_router("round_robin"),
                            pipelined=True, arrivals_at_step_boundaries=True).run()  # fmt: skip
    part = rec.replicas[0]
    held = part.num_running + part.num_waiting
    return float(np.average(held, weights=part.step_durations()))


def summarize_runs(runs: list[dict]) -> list[dict]:
    out = []
    for row in ROWS:
        for pattern in PATTERNS:
            for factor in sorted({r["factor"] for r in runs}):
                mine = [
                    r
                    for r in runs
                    if (r["row"], r["pattern"], r["factor"]) == (row, pattern, factor)
                ]
                if not mine:
                    continue
                g, gpu = (
                    mean_ci([r["goodput"] for r in mine]),
                    mean_ci([r["gpu_seconds"] for r in mine]),
                )
                out.append({"row": row, "pattern": pattern, "factor": factor,
                            "delay_s": mine[0]["delay_s"], "goodput": g,
                            "gpu_seconds": gpu})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "autoscale"))
    args = ap.parse_args(argv)
    if not TRACE.exists():
        raise SystemExit(f"autoscale_study: the Azure trace is not at {TRACE}")
    seeds, factors = (SEEDS[:1], DELAY_FACTORS[:1]) if args.quick else (SEEDS, DELAY_FACTORS)
    duration = 90.0 if args.quick else DURATION_S
    per = per_replica_concurrency()
    tasks = [Task(row, p, f, s, duration, per) for s in seeds for p in PATTERNS for row in ROWS
             for f in (factors if row != "static" else factors[:1])]  # fmt: skip
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(run_task, tasks))
    doc = {"conditions": {"backend": "simulated", "model": "qwen2.5-7b", "gpu": "H200",
                          "max_replicas": MAX_REPLICAS, "initial": INITIAL,
                          "interval_s": INTERVAL_S, "duration_s": duration,
                          "slo": {"ttft_s": SLO_TTFT, "itl_s": SLO_ITL}, "seeds": list(seeds),
                          "rows": list(ROWS), "per_replica_capacity": CAPACITY,
                          "target_per_replica": per},
           "runs": runs, "summary": summarize_runs(runs)}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the figures to 8 significant digits (at 6 the figure's antialiasing moves), the conditions
    # as set (the per-replica target is one measurement, handed to the autoscalers as it is)
    text = compact_json.dumps(doc, 8, sort_keys=False, exact=("conditions",))
    (out / "autoscale.json").write_text(text)
    for s in doc["summary"]:
        print(
            s["row"],
            s["pattern"],
            s["factor"],
            round(s["goodput"][0], 3),
            round(s["gpu_seconds"][0]),
        )
    return doc


if __name__ == "__main__":
    main()
