"""The disaggregation study: prefill/decode replicas against co-located ones at equal GPU count.

    python -m experiments.disagg_study [--jobs 2] [--quick] [--out results/disagg]

Claim (DistServe): disaggregating prefill and decode wins goodput per GPU under tight ITL SLOs,
because a decode step never shares its GPU with a prefill chunk. Setting: 4 GPUs, each one
replica of the Qwen2.5-7B shape on an H200 (3,000 blocks of 16 tokens, fcfs, the cost model
fitted to the engine's online steps, the engine's loop); ShareGPT first turns (held-out half),
Poisson; rows: ``colocated`` (4 mixed replicas, least-loaded) and ``pd_<P>_<D>`` (P prefill
replicas routed least-loaded, D decode replicas chosen by free KV, KV over NVLink: 450 GB/s per
direction, ``simulator.kv_link``); 5 loads per GPU, seeds 0-2. Every run is judged under TTFT
1 s and three ITL SLOs (20, 35, 50 ms) from the same records; goodput per GPU is the share of
requests meeting both times the offered load per GPU. Writes ``<out>/disagg.json``: every
run's figures, then per row, SLO and load the mean goodput per GPU with a 95% t interval.
``--quick``: one seed, two loads, 800 requests.
"""

from __future__ import annotations

import argparse
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments import compact_json
from experiments.cluster_setup import ReplicaSpec, simulate_cluster
from experiments.gain_stats import mean_ci
from horizon.cluster import make_router
from horizon.cluster.disagg_metrics import goodput_per_gpu, ttft_breakdown
from horizon.metrics import summarize
from horizon.request import SLO

REPO = Path(__file__).resolve().parents[1]
TOKENS = REPO / "data" / "cache" / "sharegpt_qwen2.5.npz"
GPUS = 4
NUM_BLOCKS = 3000
ROWS = {"colocated": (0, 0), "pd_1_3": (1, 3), "pd_2_2": (2, 2), "pd_3_1": (3, 1)}
LOADS = (20.0, 30.0, 40.0, 50.0, 60.0)  # requests/s per GPU
SEEDS = (0, 1, 2)
REQUESTS = 4000
SLO_TTFT = 1.0
SLO_ITLS = (0.020, 0.035, 0.050)
LINK = "nvlink"


@dataclass(frozen=True)
class Task:
    row: str
    load: float
    seed: int
    requests: int = REQUESTS


_TOKENIZED: dict = {}


def _requests(task: Task) -> tuple:
    from horizon.workload import WorkloadConfig, build_workload, load_sharegpt, tokenize_corpus

    if "t" not in _TOKENIZED:
        _TOKENIZED["t"] = tokenize_corpus(load_sharegpt(), TOKENS)
    cfg = WorkloadConfig(
        num_requests=task.requests,
        rate=GPUS * task.load,
        seed=task.seed,
        conversations="held_out",
        split_test_fraction=0.5,
    )
    return build_workload(cfg, _TOKENIZED["t"]).requests


def run_task(task: Task) -> dict:
    """One simulated run's figures under every ITL SLO."""
    from simulator.kv_link import link_spec

    n_prefill, n_decode = ROWS[task.row]
    roles = ["mixed"] * GPUS if not n_prefill else ["prefill"] * n_prefill + ["decode"] * n_decode
    cache: dict = {}
    replicas = [ReplicaSpec(num_blocks=NUM_BLOCKS, role=r).setup(None, cache) for r in roles]
    disagg = n_prefill > 0
    rec = simulate_cluster(
        replicas,
        make_router("least_loaded"),
        _requests(task),
        decode_router=make_router("least_kv") if disagg else None,
        kv_link=link_spec(LINK) if disagg else None,
    )
    rec.check()
    merged = rec.merged()
    out: dict = {"row": task.row, "load": task.load, "seed": task.seed}
    for itl in SLO_ITLS:
        slo = SLO(SLO_TTFT, itl)
        m = summarize(merged, slo=slo)
        out[f"itl{int(itl * 1e3)}"] = {
            "goodput": m["goodput_lifetime"],  # share of requests meeting every SLO
            "goodput_per_gpu": m["goodput_lifetime"] * task.load,  # good req/s per GPU
            "good_rps_per_gpu_over_span": goodput_per_gpu(rec, slo, gpus=GPUS),
        }
    m = summarize(merged, slo=SLO(SLO_TTFT, SLO_ITLS[-1]))
    out.update({k: m[k] for k in ("ttft_mean", "ttft_p99", "itl_mean", "itl_p99")})
    out["ttft_parts"] = ttft_breakdown(rec) if disagg else None
    return out


def summarize_runs(runs: list[dict]) -> dict:
    """Per row, ITL SLO and load: mean goodput per GPU over seeds with a 95% t interval, and
    the mean p99 ITL."""
    out: dict = {}
    loads = sorted({r["load"] for r in runs})
    for row in ROWS:
        for itl in SLO_ITLS:
            key = f"itl{int(itl * 1e3)}"
            per_load = []
            for load in loads:
                mine = [r for r in runs if r["row"] == row and r["load"] == load]
                mean, lo, hi = mean_ci([r[key]["goodput_per_gpu"] for r in mine])
                p99 = float(np.mean([r["itl_p99"] for r in mine]))
                per_load.append({"load": load, "goodput_per_gpu": mean, "ci95": [lo, hi],
                                 "itl_p99": p99})  # fmt: skip
            out.setdefault(row, {})[key] = per_load
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "disagg"))
    args = ap.parse_args(argv)
    loads, seeds, n = (LOADS[1::2], SEEDS[:1], 800) if args.quick else (LOADS, SEEDS, REQUESTS)
    tasks = [Task(row, load, seed, n) for seed in seeds for load in loads for row in ROWS]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        runs = list(pool.map(run_task, tasks))
    doc = {"conditions": _conditions(args.quick), "runs": runs, "summary": summarize_runs(runs)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "disagg.json").write_text(compact_json.dumps(doc, 6, False, ("conditions",)))
    for row, by in doc["summary"].items():
        print(row, [round(x["goodput_per_gpu"], 2) for x in by["itl35"]])
    return doc


def _conditions(quick: bool) -> dict:
    return {
        "backend": "simulated",
        "model": "qwen2.5-7b (engine-fitted cost model, calibration/h200_qwen2.5-7b_online)",
        "gpu": "H200",
        "gpus": GPUS,
        "num_blocks": NUM_BLOCKS,
        "policy": "fcfs",
        "workload": "ShareGPT first turns, held-out half, Poisson",
        "rows": {k: {"prefill": p, "decode": d} for k, (p, d) in ROWS.items()},
        "routers": {"first": "least_loaded", "decode": "least_kv"},
        "kv_link": LINK,
        "slo": {"ttft_s": SLO_TTFT, "itl_s": list(SLO_ITLS)},
        "loads_req_s_per_gpu": list(LOADS[1::2] if quick else LOADS),
        "seeds": list(SEEDS[:1] if quick else SEEDS),
        "requests": 800 if quick else REQUESTS,
    }


if __name__ == "__main__":
    main()
