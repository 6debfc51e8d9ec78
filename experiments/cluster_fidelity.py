"""The cluster simulator against co-located engine replicas on one GPU.

    python -m experiments.cluster_fidelity export [--out gpu_inputs/cluster]
    # on the GPU machine, per replica count N:
    python -m experiments.cluster_engine_replay \
        --manifest gpu_inputs/cluster/n<N>/cluster_manifest.json --out ENGINE/n<N>
    python -m experiments.cluster_fidelity tabulate ENGINE    # -> results/cluster_fidelity/ tables
    python -m experiments.cluster_fidelity compare            # from those tables

Cases: N = 2 and 4 replicas of the Qwen2.5-0.5B shape (seeded random weights, 2,000 KV blocks
each, fcfs) on one H200, routers round_robin, least_loaded and prefix_aware, a shared-prefix
workload (32 system prompts of 1,024 tokens) and closed-loop ShareGPT sessions, 3 loads each;
the middle load's round_robin case runs twice (``_rep``), which measures the engine's own
run-to-run noise. The comparison simulates every case with the same requests and router, each
replica's cost model fitted to the co-located engine steps of every case at the same N
(``sim``), and again with a model fitted to the *other* workload's steps only
(``sim_other_workload_fit``: leave one workload out, the model never saw the steps it prices),
and with the model of one replica alone on the GPU (``calibration/``), every replica's steps
serialized on one shared device (``sim_shared_device``: nothing fitted to co-located steps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-0.5b"
NUM_BLOCKS = 2000
SLO_TTFT, SLO_ITL = 0.25, 0.01
ROUTERS = ("round_robin", "least_loaded", "prefix_aware")
ENGINE = {
    "num_blocks": NUM_BLOCKS,
    "max_model_len": 8192,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
}
SECONDS = 10.0  # arrivals span about this long per case
# per replica count: workload -> loads (shared_prefix: req/s per replica; sessions: starts/s)
LOADS = {  # around each knee: 4 co-located replicas share the GPU that 2 share
    2: {"shared_prefix": (20.0, 30.0, 40.0), "sessions": (10.0, 18.0, 26.0)},
    4: {"shared_prefix": (10.0, 15.0, 20.0), "sessions": (10.0, 18.0, 26.0)},
}


@dataclass(frozen=True)
class CaseKey:
    n: int
    workload: str
    load: float
    router: str
    repeat: bool = False

    @property
    def name(self) -> str:
        return f"{self.workload}_{self.load:g}_{self.router}" + ("_rep" if self.repeat else "")


def case_keys(n: int, loads: dict | None = None) -> list[CaseKey]:
    keys = []
    for workload, grid in (loads or LOADS[n]).items():
        for load in grid:
            keys.extend(CaseKey(n, workload, load, r) for r in ROUTERS)
        keys.append(CaseKey(n, workload, grid[len(grid) // 2], "round_robin", True))
    return keys


def workload_of(key: CaseKey, tokenized) -> tuple[tuple, tuple]:  # noqa: ANN001
    """(requests, sessions) of a case; seeded by the case's load, so repeats are identical."""
    from horizon.workload import (
        SessionConfig,
        SharedPrefixConfig,
        build_sessions,
        build_shared_prefix,
    )

    if key.workload == "shared_prefix":
        n = int(SECONDS * key.n * key.load)
        cfg = SharedPrefixConfig(
            num_requests=n,
            num_groups=32,
            prefix_tokens=1024,
            rate=key.n * key.load,
            seed=int(key.load),
        )
        return build_shared_prefix(cfg, tokenized), ()
    cfg = SessionConfig(
        num_sessions=int(SECONDS * key.load * 2 / 3),
        session_rate=key.load,
        think_time_mean=1.0,
        max_turns=6,
        seed=int(key.load),
    )
    return (), build_sessions(cfg, tokenized)


def export(out: Path) -> list[Path]:
    """Requests/sessions files and one cluster manifest per replica count under ``out``."""
    from experiments.cluster_manifest import ClusterCase, ClusterManifest, ReplicaEntry, RouterSpec
    from horizon.workload import load_sharegpt, tokenize_corpus
    from horizon.workload.requests_file import save_requests
    from horizon.workload.sessions_file import save_sessions

    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    written = []
    for n in LOADS:
        d = out / f"n{n}"
        d.mkdir(parents=True, exist_ok=True)
        cases = []
        for key in case_keys(n):
            requests, sessions = workload_of(key, tokenized)
            file = f"{key.workload}_{key.load:g}.json.xz"
            if not (d / file).exists():
                (
                    save_requests(requests, d / file)
                    if requests
                    else save_sessions(sessions, d / file)
                )
            which = {"requests": file} if requests else {"sessions": file}
            cases.append(ClusterCase(key.name, RouterSpec(key.router), **which))
        m = ClusterManifest(
            MODEL,
            tuple(ReplicaEntry("cuda") for _ in range(n)),
            tuple(cases),
            dict(ENGINE),
            SLO_TTFT,
            {"commit": commit},
        )
        m.save(d / "cluster_manifest.json")
        written.append(d / "cluster_manifest.json")
    return written


def load_engine_case(case_dir: Path):  # noqa: ANN201 - (ClusterRecords, meta)
    """A case's engine records (one RunRecords per replica) and its meta.json."""
    import numpy as np

    from horizon.cluster import ClusterRecords
    from horizon.metrics.records import RunRecords

    meta = json.loads((case_dir / "meta.json").read_text())
    parts = tuple(
        RunRecords.load_npz(str(case_dir / f"replica{i}" / "records.npz"))
        for i in range(len(meta["replicas"]))
    )
    names = tuple(r["name"] or f"replica{i}" for i, r in enumerate(meta["replicas"]))
    transfers = None
    if (case_dir / "transfers.npz").exists():
        with np.load(case_dir / "transfers.npz") as z:
            transfers = {k: z[k] for k in z.files}
    rec = ClusterRecords(
        parts, np.array(meta["assignment"], dtype=np.int64), float(meta["route_wall_s"]), names,
        transfers,
    )
    rec.check()
    return rec, meta


def fit_cost_models(table: Path, n: int, workloads: list[str]) -> dict:
    """At ``n`` replicas, engine-fitted models with the engine's graph buckets: ``"all"`` fitted
    to every case's co-located steps (every replica's), and per workload one fitted to the
    *other* workloads' steps only (leave one workload out). Steps from ``tabulate``'s files."""
    import numpy as np

    from simulator.engine_cost_model import Buckets, EngineCostModel, read_steps

    buckets = Buckets(ENGINE["max_num_seqs"], ENGINE["max_num_batched_tokens"])
    rows = {w: read_steps(table / steps_file(n, w))[0] for w in workloads}
    out = {"all": EngineCostModel.fit(np.concatenate(list(rows.values())), buckets)}
    for w in workloads:
        others = np.concatenate([r for v, r in rows.items() if v != w])
        out[w] = EngineCostModel.fit(others, buckets)
    return out


def steps_file(n: int, workload: str) -> str:
    return f"steps_n{n}_{workload}.csv.gz"


def simulate_case(key: CaseKey, cost_model, tokenized, device: str | None = None):  # noqa: ANN001, ANN201
    """The case on the cluster simulator (ClusterRecords); ``device``: every replica on that one
    shared GPU, steps serialized (``simulator.shared_device``), else each on its own."""
    from experiments.cluster_setup import simulate_cluster
    from horizon.cluster import make_router
    from horizon.model_shape import model_shape
    from horizon.policies import make_policy
    from horizon.scheduler_config import SchedulerConfig
    from simulator.cluster_simulation import ReplicaSetup

    cfg = SchedulerConfig(
        num_blocks=NUM_BLOCKS,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        max_model_len=ENGINE["max_model_len"],
    )
    shape = model_shape(MODEL)
    setups = [
        ReplicaSetup(cfg, make_policy("fcfs"), cost_model, shape, device=device)
        for _ in range(key.n)
    ]
    requests, sessions = workload_of(key, tokenized)
    return simulate_cluster(setups, make_router(key.router), requests, sessions)


def figures(rec) -> dict:  # noqa: ANN001 - ClusterRecords
    """The figures a side of the comparison is judged by."""
    from horizon.cluster.metrics import cluster_summary
    from horizon.metrics import summarize
    from horizon.request import SLO

    slo = SLO(SLO_TTFT, SLO_ITL)
    c, m = cluster_summary(rec, slo), summarize(rec.merged(), slo=slo)
    return {
        "goodput": c["goodput"],
        "tpot_goodput": c["tpot_goodput"],
        "prefix_hit_rate": c["prefix_hit_rate"],
        "imbalance": c["imbalance"]["max_over_mean"],
        "requests": c["requests"],
        **{k: m[k] for k in ("ttft_mean", "ttft_p99", "itl_mean", "itl_p99", "e2e_mean")},
    }


def prompt_digest(rec) -> str:  # noqa: ANN001 - ClusterRecords
    """SHA-256 of every request's prompt length in id order: the workload's fingerprint."""
    import hashlib

    import numpy as np

    lengths = np.ascontiguousarray(rec.merged().num_prompt_tokens, dtype=np.int64)
    return hashlib.sha256(lengths.tobytes()).hexdigest()


def parse_case(n: int, name: str) -> CaseKey:
    """The key of a case directory's name (``<workload>_<load>_<router>[_rep]``)."""
    repeat = name.endswith("_rep")
    stem = name[: -len("_rep")] if repeat else name
    for workload in ("shared_prefix", "sessions"):
        for router in ROUTERS:
            head, tail = f"{workload}_", f"_{router}"
            if stem.startswith(head) and stem.endswith(tail):
                return CaseKey(n, workload, float(stem[len(head) : -len(tail)]), router, repeat)
    raise ValueError(f"case directory {name!r}: not <workload>_<load>_<router>[_rep]")


META = ("gpu", "date", "commit", "torch", "triton", "wall_s", "route_lag")


def tabulate(engine_root: Path, out: Path) -> Path:
    """The engine's cases under ``engine_root/n<N>/<case>/`` as one sweep's tables in ``out``:
    ``steps_n<N>_<workload>.csv.gz`` (every replica's step rows, the calibration format) and
    ``engine_cases.json`` (each case's figures, its workload's fingerprint and its meta)."""
    from simulator.engine_cost_model import rows_of, write_steps

    cases, steps = [], {}
    for nd in sorted(engine_root.glob("n*")):
        n = int(nd.name[1:])
        for cd in sorted(p for p in nd.iterdir() if (p / "meta.json").exists()):
            key = parse_case(n, cd.name)
            rec, meta = load_engine_case(cd)
            steps.setdefault((n, key.workload), []).extend(rec.replicas)
            cases.append(
                {
                    "n": n,
                    "case": key.name,
                    "engine": figures(rec),
                    "prompt_digest": prompt_digest(rec),
                    "meta": {k: meta[k] for k in META},
                }
            )
    out.mkdir(parents=True, exist_ok=True)
    for (n, w), recs in sorted(steps.items()):
        write_steps(
            rows_of(recs),
            out / steps_file(n, w),
            {
                "replicas": n,
                "workload": w,
                "step_s": "each step's own time in the co-located engine's online loop",
            },
        )
    (out / "engine_cases.json").write_text(json.dumps(cases, separators=(",", ":")) + "\n")
    return out / "engine_cases.json"


def compare(table: Path) -> dict:
    """Every tabulated engine case (``tabulate``'s files in ``table``) against its simulation."""
    from horizon.workload import load_sharegpt, tokenize_corpus

    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    cases = json.loads((table / "engine_cases.json").read_text())
    isolated = isolated_cost_model()
    rows = []
    for n in sorted({c["n"] for c in cases}):
        mine = sorted((c for c in cases if c["n"] == n), key=lambda c: c["case"])
        keys = [parse_case(n, c["case"]) for c in mine]
        models = fit_cost_models(table, n, sorted({k.workload for k in keys}))
        models["isolated"] = isolated
        for key, case in zip(keys, mine):
            rows.append(compare_case(key, case, models, tokenized))
    return {
        "conditions": _conditions(),
        "cases": rows,
        "summary": summarize_rows(rows),
        "summary_shared_device": summarize_rows(rows, "sim_shared_device"),
    }


def compare_case(key: CaseKey, case: dict, models: dict, tokenized) -> dict:  # noqa: ANN001
    """One engine case against its three simulations: fitted to every case's co-located steps,
    fitted to the other workload's only, and the isolated replica's model on a shared GPU."""
    sim = simulate_case(key, models["all"], tokenized)
    assert prompt_digest(sim) == case["prompt_digest"], (
        f"{key.name}: the regenerated workload differs from the engine's"
    )
    lowo = simulate_case(key, models[key.workload], tokenized)
    shared = simulate_case(key, models["isolated"], tokenized, device="gpu0")
    row = {
        "n": key.n,
        "workload": key.workload,
        "load": key.load,
        "router": key.router,
        "repeat": key.repeat,
        "engine": case["engine"],
        "sim": figures(sim),
        "sim_other_workload_fit": figures(lowo),
        "sim_shared_device": figures(shared),
        "engine_meta": case["meta"],
    }
    row["goodput_error_pts"] = error_pts(row, "sim")
    row["goodput_error_pts_shared_device"] = error_pts(row, "sim_shared_device")
    return row


def isolated_cost_model():  # noqa: ANN201 - EngineCostModel
    """The engine-fitted model of one 0.5B replica alone on the H200 (its calibration file,
    as ``ReplicaSpec`` picks it)."""
    from experiments.cluster_setup import ReplicaSpec

    return ReplicaSpec(shape=MODEL, num_blocks=NUM_BLOCKS).setup().cost_model


def summarize_rows(rows: list[dict], side: str = "sim") -> dict:
    """Noise band per (N, workload); for the simulated figures ``side``: error within band per
    case and the router ranking per load."""
    noise = noise_bands(rows)
    groups: dict = {}
    for r in rows:
        if not r["repeat"]:
            groups.setdefault((r["n"], r["workload"], r["load"]), []).append(r)
    rankings = [
        ranking(rs, side, max(2.0, noise.get(f"n{n}_{w}", 0.0)))
        | {"n": n, "workload": w, "load": load}
        for (n, w, load), rs in sorted(groups.items())
    ]
    errs = [abs(error_pts(r, side)) for r in rows]
    within = [e <= max(2.0, noise.get(f"n{r['n']}_{r['workload']}", 0)) for e, r in zip(errs, rows)]
    return {
        "noise_band_pts": noise,
        "rankings": rankings,
        "cases_within_band": sum(within),
        "cases": len(rows),
        "max_abs_error_pts": max(errs) if errs else None,
        "mean_abs_error_pts": sum(errs) / len(errs) if errs else None,
    }


def error_pts(row: dict, side: str) -> float:
    return 100 * (row[side]["goodput"] - row["engine"]["goodput"])


def noise_bands(rows: list[dict]) -> dict:
    """Per (N, workload): the engine's goodput gap, in points, between a case and its repeat."""
    noise = {}
    for r in rows:
        if r["repeat"]:
            orig = next(
                o
                for o in rows
                if not o["repeat"]
                and (o["n"], o["workload"], o["load"], o["router"])
                == (r["n"], r["workload"], r["load"], r["router"])
            )
            gap = 100 * abs(r["engine"]["goodput"] - orig["engine"]["goodput"])
            noise[f"n{r['n']}_{r['workload']}"] = gap
    return noise


def ranking(rs: list[dict], side: str, band: float) -> dict:
    """The routers' goodput order on the engine and on ``side`` at one load."""
    order = {
        k: [x["router"] for x in sorted(rs, key=lambda x: -x[k]["goodput"])]
        for k in ("engine", side)
    }
    eng = {x["router"]: x["engine"]["goodput"] for x in rs}
    # a pair whose engine goodputs are within the band is a tie: either order agrees
    agree = all(
        (eng[a] - eng[b]) * 100 <= band or order[side].index(a) < order[side].index(b)
        for i, a in enumerate(order["engine"])
        for b in order["engine"][i + 1 :]
    )
    return {
        "band_pts": band,
        "engine_order": order["engine"],
        "sim_order": order[side],
        "same_order": order["engine"] == order[side],
        "agrees_up_to_ties": agree,
        "max_abs_error_pts": max(abs(error_pts(x, side)) for x in rs),
    }


def _conditions() -> dict:
    return {
        "model": MODEL,
        "weights": "seeded random",
        "num_blocks_per_replica": NUM_BLOCKS,
        "policy": "fcfs",
        "slo": {"ttft_s": SLO_TTFT, "itl_s": SLO_ITL},
        "engine": ENGINE,
        "routers": list(ROUTERS),
        "sim_cost_model": "engine-fitted, to every case's co-located steps at the "
        "same replica count",
        "sim_shared_device_cost_model": "engine-fitted to one replica alone on the GPU "
        f"(calibration/h200_{MODEL}_online.csv.gz), every replica's steps serialized on one "
        "shared device",
        "sim_loop": "pipelined, arrivals between steps",
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", default=str(REPO / "gpu_inputs" / "cluster"))
    t = sub.add_parser("tabulate")
    t.add_argument("engine", help="directory of n<N>/<case>/ engine results (the GPU's output)")
    t.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity"))
    c = sub.add_parser("compare")
    c.add_argument("--table", default=str(REPO / "results" / "cluster_fidelity"))
    c.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity"))
    args = ap.parse_args(argv)
    if args.cmd == "export":
        for p in export(Path(args.out)):
            print(p)
        return
    if args.cmd == "tabulate":
        print(tabulate(Path(args.engine), Path(args.out)))
        return
    doc = compare(Path(args.table))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster_fidelity.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(json.dumps(doc["summary"]["rankings"][:2]))
    print(
        json.dumps(
            {
                k: doc["summary"][k]
                for k in ("cases", "cases_within_band", "max_abs_error_pts", "noise_band_pts")
            }
        )
    )


if __name__ == "__main__":
    main()
