"""The cluster studies: routing across instances, and multi-turn KV reuse across instances.

    python -m experiments.cluster_study [--setting first_turn|shared_prefix|sessions]...
        [--jobs 2] [--quick] [--out results/cluster]

Per setting (``experiments.cluster_settings``), row (router and knobs), load and seed: one
simulated cluster run; its cluster goodput (both kinds), prefix-cache hit rate, load imbalance,
TTFT/ITL and routing rate. Writes ``<out>/<setting>.json`` (every run, then the summary over
seeds: means with 95% t intervals per load, ``rate_at_90`` per seed by interpolation on the
load grid, and paired ratios against round_robin and least_loaded); ``experiments.cluster_report``
renders it. ``--quick``: one seed, every other load, 600 requests or 300 sessions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments.cluster_settings import (
    NUM_BLOCKS,
    REPLICAS,
    REQUESTS,
    SEEDS,
    SESSIONS,
    SETTINGS,
    SLO_ITL,
    SLO_TTFT,
    THINK_TIME_S,
    Setting,
)
from experiments.cluster_setup import ReplicaSpec, build_router, simulate_cluster
from horizon.cluster.metrics import cluster_summary
from horizon.metrics import summarize
from horizon.request import SLO

REPO = Path(__file__).resolve().parents[1]
TOKENS = REPO / "data" / "cache" / "sharegpt_qwen2.5.npz"


@dataclass(frozen=True)
class Task:
    setting: str
    row: str
    load: float
    seed: int
    requests: int = REQUESTS
    sessions: int = SESSIONS


class Inputs:
    """What a worker loads once: the tokenized corpus, the fitted predictor, cost models and
    the latest workload (tasks of one workload run back to back)."""

    def __init__(self) -> None:
        from horizon.workload import load_sharegpt, tokenize_corpus

        self.tokenized = tokenize_corpus(load_sharegpt(), TOKENS)
        self.cost_models: dict = {}
        self._predictor = None
        self._workload: tuple[tuple, object] | None = None

    def predictor(self):  # noqa: ANN201
        """The prompt-length predictor fitted on the training split's first turns."""
        if self._predictor is None:
            from horizon.workload import WorkloadConfig, build_workload
            from predictors import make_predictor

            cfg = WorkloadConfig(num_requests=5000, conversations="train", split_test_fraction=0.5)
            train = build_workload(cfg, self.tokenized).requests
            self._predictor = make_predictor("prompt_length").fit(train)
        return self._predictor

    def workload(self, setting: Setting, task: Task) -> tuple[tuple, tuple]:
        """(requests, sessions) of ``task``'s workload."""
        key = (setting.name, task.load, task.seed, task.requests, task.sessions)
        if self._workload is None or self._workload[0] != key:
            self._workload = (key, _build_workload(setting, task, self.tokenized))
        return self._workload[1]  # type: ignore[return-value]


def _build_workload(setting: Setting, task: Task, tokenized) -> tuple[tuple, tuple]:  # noqa: ANN001
    from horizon.workload import (
        SessionConfig,
        SharedPrefixConfig,
        WorkloadConfig,
        build_sessions,
        build_shared_prefix,
        build_workload,
    )

    rate = REPLICAS * task.load
    if setting.kind == "first_turn":
        cfg = WorkloadConfig(
            num_requests=task.requests,
            rate=rate,
            seed=task.seed,
            conversations="held_out",
            split_test_fraction=0.5,
        )
        return build_workload(cfg, tokenized).requests, ()
    if setting.kind == "shared_prefix":
        cfg = SharedPrefixConfig(
            num_requests=task.requests, rate=rate, seed=task.seed, **setting.options
        )
        return build_shared_prefix(cfg, tokenized), ()
    cfg = SessionConfig(
        num_sessions=task.sessions,
        session_rate=task.load,
        think_time_mean=THINK_TIME_S,
        seed=task.seed,
    )
    return (), build_sessions(cfg, tokenized)


def run_task(task: Task, inputs: Inputs) -> dict:
    """One run's figures (and, for seed 0 at the middle load, per-replica queue traces)."""
    setting = SETTINGS[task.setting]
    name, options = setting.rows[task.row]
    requests, sessions = inputs.workload(setting, task)
    uses_predictor = name == "horizon"
    predictor = inputs.predictor() if uses_predictor else None
    spec = ReplicaSpec(num_blocks=NUM_BLOCKS)
    replicas = [spec.setup(predictor, inputs.cost_models) for _ in range(REPLICAS)]
    router = build_router(name, options, SLO_TTFT, inputs.predictor if uses_predictor else None)
    t0 = time.perf_counter()
    rec = simulate_cluster(replicas, router, requests, sessions)
    wall = time.perf_counter() - t0
    rec.check()
    out = {
        "setting": task.setting,
        "row": task.row,
        "load": task.load,
        "seed": task.seed,
        "wall_s": round(wall, 3),
        **_figures(rec),
    }
    if task.seed == SEEDS[0] and task.load == setting.loads[len(setting.loads) // 2]:
        out["queue_trace"] = _queue_trace(rec)
    return out


def _figures(rec) -> dict:  # noqa: ANN001 - ClusterRecords
    slo = SLO(SLO_TTFT, SLO_ITL)
    c = cluster_summary(rec, slo)
    m = summarize(rec.merged(), slo=slo)
    keys = (
        "ttft_mean",
        "ttft_p99",
        "itl_p99",
        "e2e_mean",
        "throughput_tok_s",
        "preemptions",
        "recompute_waste",
        "queue_wait_p99",
    )
    return {
        "requests": c["requests"],
        "goodput": c["goodput"],
        "tpot_goodput": c["tpot_goodput"],
        "prefix_hit_rate": c["prefix_hit_rate"],
        "imbalance_max_over_mean": c["imbalance"]["max_over_mean"],
        "imbalance_cv": c["imbalance"]["cv"],
        "routing_decisions_per_s": c["routing_decisions_per_s"],
        "replica_goodput": [p["goodput"] for p in c["per_replica"]],
        "replica_requests": [p["requests"] for p in c["per_replica"]],
        **{k: m[k] for k in keys},
    }


def _queue_trace(rec, bin_s: float = 1.0) -> dict:  # noqa: ANN001
    """Each replica's waiting requests at the end of each ``bin_s`` window (last step in it)."""
    end = max(float(r.step_end[-1]) for r in rec.replicas if len(r.step_end))
    edges = np.arange(bin_s, end + bin_s, bin_s)
    series = []
    for r in rec.replicas:
        i = np.searchsorted(r.step_end, edges, side="right") - 1
        series.append(np.where(i >= 0, r.num_waiting[np.maximum(i, 0)], 0).tolist())
    return {"t": edges.tolist(), "waiting": series}


_INPUTS: Inputs | None = None


def _in_worker(task: Task) -> dict:
    global _INPUTS  # one per worker process: the corpus and fits are loaded once there
    if _INPUTS is None:
        _INPUTS = Inputs()
    return run_task(task, _INPUTS)


def run_tasks(tasks: list[Task], jobs: int) -> list[dict]:
    """Results in ``tasks``' order, in this process or ``jobs`` forked workers."""
    if jobs == 1:
        inputs = Inputs()
        return [run_task(t, inputs) for t in tasks]
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(_in_worker, tasks, chunksize=1))


def tasks_of(setting: Setting, quick: bool) -> list[Task]:
    """Every (row, load, seed) of ``setting``, grouped by workload (load, seed)."""
    loads = setting.loads[::2] if quick else setting.loads
    seeds = SEEDS[:1] if quick else SEEDS
    size = {"requests": 600, "sessions": 300} if quick else {}
    return [
        Task(setting.name, row, float(load), seed, **size)
        for load in loads
        for seed in seeds
        for row in setting.rows
    ]


def main(argv: list[str] | None = None) -> dict:
    from experiments.cluster_summary import summarize_setting

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", action="append", choices=sorted(SETTINGS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "cluster"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    headline = {}
    for name in args.setting or sorted(SETTINGS):
        setting = SETTINGS[name]
        t0 = time.perf_counter()
        runs = run_tasks(tasks_of(setting, args.quick), args.jobs)
        summary = summarize_setting(setting, runs)
        doc = {"conditions": _conditions(setting, args.quick), "summary": summary, "runs": runs}
        (out / f"{name}.json").write_text(compact_json.dumps(doc, 6, False, ("conditions",)))
        headline[name] = {r: s["rate_at_90"] for r, s in summary["rows"].items()}
        print(f"{name}: {len(runs)} runs in {time.perf_counter() - t0:.0f} s", flush=True)
    print(json.dumps(headline))
    return headline


def _conditions(setting: Setting, quick: bool) -> dict:
    return {
        "backend": "simulator (engine-fitted cost model, the engine's pipelined loop)",
        "model": "qwen2.5-7b",
        "gpu": "H200",
        "replicas": REPLICAS,
        "num_blocks_per_replica": NUM_BLOCKS,
        "policy": "fcfs",
        "slo": {"ttft_s": SLO_TTFT, "itl_s": SLO_ITL},
        "workload": setting.kind,
        "workload_options": setting.options,
        "load_unit": "session starts/s" if setting.kind == "sessions" else "req/s per replica",
        "seeds": list(SEEDS[:1] if quick else SEEDS),
        "quick": quick,
        "requests": 600 if quick else REQUESTS,
        "sessions": 300 if quick else SESSIONS,
        "think_time_mean_s": THINK_TIME_S,
        "horizon_router_predictor": "prompt_length",
        "rows": {k: {"router": v[0], "options": v[1]} for k, v in setting.rows.items()},
    }


if __name__ == "__main__":
    main()
