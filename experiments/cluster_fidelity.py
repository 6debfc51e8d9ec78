"""The cluster simulator against co-located engine replicas on one GPU.

    python -m experiments.cluster_fidelity export [--out gpu_inputs/cluster] [--alone]
    # on the GPU machine, per replica count N:
    python -m experiments.cluster_engine_replay \
        --manifest gpu_inputs/cluster/n<N>/cluster_manifest.json --out ENGINE/n<N>
    python -m experiments.cluster_fidelity tabulate ENGINE    # -> results/cluster_fidelity/ tables
    python -m experiments.cluster_fidelity fit-sharing ENGINE --source TEXT
                                              # -> results/cluster_fidelity/device_sharing_fit.json
    python -m experiments.cluster_fidelity fit-colocated ENGINE --source TEXT
                                              # -> results/cluster_fidelity/colocated_fit.json
    python -m experiments.cluster_fidelity compare            # from those tables and fits
                                              # -> cluster_fidelity.json, variants.md

Cases: N = 2 and 4 replicas of the Qwen2.5-0.5B shape (seeded random weights, 2,000 KV blocks
each, fcfs) on one H200, routers round_robin, least_loaded and prefix_aware, a shared-prefix
workload (32 system prompts of 1,024 tokens) and closed-loop ShareGPT sessions, 3 loads each;
the middle load's round_robin case runs twice (``_rep``), which measures the engine's own
run-to-run noise. The comparison simulates every case with the same requests and router, each
replica's cost model fitted to the co-located engine steps of every case at the same N
(``sim``), and again with a model fitted to the *other* workload's steps only
(``sim_other_workload_fit``: leave one workload out, the model never saw the steps it prices),
and with the model of one replica alone on the GPU (``calibration/``), every replica's steps
on one shared device: serialized first come first served (``sim_shared_device``: nothing
fitted to co-located steps) and time-sliced (``sim_timeslice``: a mixed step's slice count
fitted to the co-located steps' timestamps, ``simulator.device_sharing``), and variant (d):
the co-located steps' own part fitted as its own cost model on that time-sliced device, slice
counts drawn (``sim_colocated``: each case priced by the fit without its load;
``_other_workload``: the other workload's fit; ``_in_sample``: every case's, labelled so;
``experiments.colocated_fit``), and variant (e): the isolated model, every replica's steps
taking round-robin turns on one simulated GPU, the time slice chosen on the other loads
(``sim_quantum``, ``experiments.cluster_quantum``). ``fit-sharing`` and ``fit-colocated``
need the engine's records themselves (each step's start and end on the shared clock), which
the tables do not keep; its output is committed beside them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from experiments import compact_json

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
SHARING_FIT = "device_sharing_fit.json"  # fit-sharing's output, beside the tables
# variant (d): the co-located own-part model on the time-sliced device, by fold
# (simulator.colocated_cost_model): judged held out (another load's or the other workload's
# fit), and in sample (labelled so)
COLOCATED_FIT = "colocated_fit.json"  # fit-colocated's output, beside the tables
COLOCATED_SIDES = ("sim_colocated", "sim_colocated_other_workload", "sim_colocated_in_sample")
SECONDS = 10.0  # arrivals span about this long per case
# per replica count: workload -> loads (shared_prefix: req/s per replica; sessions: starts/s)
LOADS = {  # around each knee: 4 co-located replicas share the GPU that 2 share
    2: {"shared_prefix": (20.0, 30.0, 40.0), "sessions": (10.0, 18.0, 26.0)},
    4: {"shared_prefix": (10.0, 15.0, 20.0), "sessions": (10.0, 18.0, 26.0)},
}
# One replica alone on the GPU (``export --alone``), at the co-located cases' loads per
# replica: the one-replica price of these workloads' steps (chunks over cached prefixes, long
# session histories), which the isolated model's calibration does not cover. ``tabulate``
# keeps these cases apart (``engine_alone.json``); ``compare`` does not read them.
ALONE = {1: {"shared_prefix": (20.0, 40.0), "sessions": (5.0, 10.0)}}


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
    routers = ROUTERS if n > 1 else ROUTERS[:1]  # one replica: every router is the same
    for workload, grid in (loads or {**LOADS, **ALONE}[n]).items():
        for load in grid:
            keys.extend(CaseKey(n, workload, load, r) for r in routers)
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


def export(out: Path, alone: bool = False) -> list[Path]:
    """Requests/sessions files and one cluster manifest per replica count under ``out``
    (``alone``: also the one-replica cases, ``ALONE``)."""
    from experiments.cluster_manifest import ClusterCase, ClusterManifest, ReplicaEntry, RouterSpec
    from horizon.workload import load_sharegpt, tokenize_corpus
    from horizon.workload.requests_file import save_requests
    from horizon.workload.sessions_file import save_sessions

    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    written = []
    for n, loads in {**LOADS, **(ALONE if alone else {})}.items():
        d = out / f"n{n}"
        d.mkdir(parents=True, exist_ok=True)
        cases = []
        for key in case_keys(n, loads):
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
        parts,
        np.array(meta["assignment"], dtype=np.int64),
        float(meta["route_wall_s"]),
        names,
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
    return f"steps_n{n}_{workload}.csv.xz"


def simulate_case(key: CaseKey, cost_model, tokenized, device: str | None = None, live=None):  # noqa: ANN001, ANN201
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
    return simulate_cluster(setups, make_router(key.router), requests, sessions, live=live)


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


def sharing_samples(engine_root: Path) -> dict:
    """Every co-located engine step as the ``timeslice`` rule sees it, from the engine's
    records under ``engine_root/n<N>/<case>/``: its case's N, workload and load index, its
    plan's columns, its measured time, its isolated time (the model of one replica alone),
    and the other replicas' steps in flight when it was planned (the pipelined engine plans
    a step while the one before runs, as the simulator submits it), as indices into the same
    arrays (-1: none)."""
    import numpy as np

    from simulator.engine_cost_model import step_rows

    iso = isolated_cost_model()
    keys = ("n", "sessions", "load_index", "rows", "pred", "dur", "others")
    parts: dict[str, list] = {k: [] for k in keys}
    base = 0
    for nd in sorted(engine_root.glob("n*")):
        n = int(nd.name[1:])
        for cd in sorted(p for p in nd.iterdir() if (p / "meta.json").exists()):
            rec, _ = load_engine_case(cd)
            reps = rec.replicas
            starts = [np.maximum(r.step_start, np.r_[-np.inf, r.step_end[:-1]]) for r in reps]
            offsets = base + np.cumsum([0] + [len(r.step_end) for r in reps])
            for i, r in enumerate(reps):
                rows = step_rows(r)
                parts["rows"].append(rows)
                parts["pred"].append(iso.predict_rows(rows))
                parts["dur"].append(rows[:, -1])
                parts["n"].append(np.full(len(rows), n))
                parts["sessions"].append(np.full(len(rows), key_workload(cd.name) == "sessions"))
                parts["load_index"].append(np.full(len(rows), load_index(parse_case(n, cd.name))))
                others = np.full((len(rows), n - 1), -1, dtype=np.int64)
                for c, j in enumerate(j for j in range(len(reps)) if j != i):
                    idx = np.searchsorted(starts[j], r.step_start, side="right") - 1
                    ok = (idx >= 0) & (reps[j].step_end[np.maximum(idx, 0)] > r.step_start)
                    others[ok, c] = offsets[j] + idx[ok]
                parts["others"].append(others)
            base = offsets[-1]
    width = max(o.shape[1] for o in parts["others"])
    parts["others"] = [
        np.pad(o, ((0, 0), (0, width - o.shape[1])), constant_values=-1) for o in parts["others"]
    ]
    return {k: np.concatenate(v) for k, v in parts.items()}


def load_index(key: CaseKey) -> int:
    """The case's place on its (N, workload) load grid: 0 (lightest) .. 2."""
    return LOADS[key.n][key.workload].index(key.load)


def key_workload(case: str) -> str:
    return "shared_prefix" if case.startswith("shared_prefix") else "sessions"


def slice_labels(x: dict):  # noqa: ANN201 - ndarray
    """Each step's measured slice count: its time beyond its own, in rounds of its neighbours'
    steps in flight (``round((measured - isolated) / sum of their isolated times)``, 1-4;
    NaN without a neighbour in flight)."""
    import numpy as np

    o = x["others"]
    round_s = np.where(o >= 0, x["pred"][np.maximum(o, 0)], 0.0).sum(axis=1)
    s = (x["dur"] - x["pred"]) / np.where(round_s > 0, round_s, np.nan)
    return np.clip(np.round(s), 1, 4)


def fit_slices(x: dict, iterations: int = 3000) -> tuple:
    """The mixed steps' slice weights: least squares of ``SLICE_TERMS`` on the label's
    midpoint (``label - 0.5``), then a seeded local search for the weights whose
    ``max(1, ceil(w . x))`` equals most labels. Returns (weights, accuracy)."""
    import numpy as np

    lab = slice_labels(x)
    sel = (x["rows"][:, 0] > 0) & np.isfinite(lab)
    feats = _slice_matrix(x["rows"][sel])
    y = lab[sel]
    w = np.linalg.lstsq(feats, y - 0.5, rcond=None)[0]

    def acc(v):  # noqa: ANN001, ANN202
        return float((np.maximum(1, np.ceil(feats @ v)) == y).mean())

    best, rng = (acc(w), w), np.random.default_rng(0)
    for _ in range(iterations):
        v = best[1] * (1 + 0.05 * rng.standard_normal(len(w)))
        a = acc(v)
        if a > best[0]:
            best = (a, v)
    return tuple(float(v) for v in best[1]), best[0]


def _slice_matrix(rows):  # noqa: ANN001, ANN202 - STEP_COLUMNS rows -> SLICE_TERMS matrix
    import numpy as np

    return np.stack(
        [
            np.ones(len(rows)),
            rows[:, 0] + rows[:, 1],
            rows[:, 4] / 1e3,
            rows[:, 3],
            rows[:, 2],
            rows[:, 1],
        ],
        axis=1,
    )


def replay_sharing(x: dict, weights: tuple) -> dict:
    """The ``timeslice`` rule on the engine's own neighbours: each step's modelled time
    ``isolated + n * sum_j isolated_j / n_j`` (``j`` its neighbours in flight), and the factor
    on the neighbours' slices that best matches the measured step-time quantiles (0.5-0.95)
    per step kind: 1 means no switch cost beyond the slices."""
    import numpy as np

    mixed = x["rows"][:, 0] > 0
    n = np.where(mixed, np.maximum(1, np.ceil(_slice_matrix(x["rows"]) @ np.array(weights))), 1)
    o = x["others"]
    per = np.where(o >= 0, (x["pred"] / n)[np.maximum(o, 0)], 0.0).sum(axis=1)
    busy = (o >= 0).any(axis=1)
    qs = np.linspace(0.5, 0.95, 10)
    factor = {}
    for kind, sel in (("decode", busy & ~mixed), ("mixed", busy & mixed)):
        q_eng = np.quantile(x["dur"][sel], qs)
        errs = {
            round(c, 2): float(
                np.mean(np.abs(np.quantile((x["pred"] + c * n * per)[sel], qs) / q_eng - 1))
            )
            for c in np.arange(0.8, 1.3, 0.01)
        }
        factor[kind] = min(errs, key=errs.get)
    # a mixed step's own part as measured (its time less its measured slice count's rounds of
    # the neighbours' slices) over its isolated time: the isolated model's error under sharing
    own = (x["dur"] - slice_labels(x) * per) / x["pred"]
    return {
        "model": x["pred"] + n * per,
        "busy": busy,
        "mixed": mixed,
        "switch_factor": factor,
        "own_ratio": own,
    }


def fit_sharing(engine_root: Path, source: str) -> dict:
    """The ``timeslice`` rule's weights and how the rule replays the engine's steps; also
    processor sharing's coefficient per step kind, the median ``(measured / isolated - 1) / k``
    (``k`` neighbours in flight), for comparison."""
    import numpy as np

    from simulator.device_sharing import SLICE_TERMS

    x = sharing_samples(engine_root)
    weights, accuracy = fit_slices(x)
    rep = replay_sharing(x, weights)
    k = (x["others"] >= 0).sum(axis=1)
    ps = (x["dur"] / x["pred"] - 1) / np.maximum(k, 1)
    groups = []
    for n in sorted(set(x["n"].tolist())):
        for sessions, w in ((True, "sessions"), (False, "shared_prefix")):
            for kind, kind_sel in (("decode", ~rep["mixed"]), ("mixed", rep["mixed"])):
                sel = rep["busy"] & kind_sel & (x["n"] == n) & (x["sessions"] == sessions)
                g = _replay_group(x["dur"][sel], rep["model"][sel], n, w, kind)
                if kind == "mixed":
                    own = rep["own_ratio"][sel]
                    g["own_over_isolated_median"] = round(float(np.nanmedian(own)), 4)
                groups.append(g)
    return {
        "rule": "timeslice: end = start + isolated + n * sum_j isolated_j / n_j over the other "
        "replicas' steps j in flight at submission; n = 1 for decode-only steps, "
        "max(1, ceil(weights . terms)) for steps with prefill chunks",
        "source": source,
        "timeslice": {"terms": list(SLICE_TERMS), "weights": list(weights)},
        "slice_label_accuracy": round(accuracy, 4),
        "switch_factor_fitted": rep["switch_factor"],
        "processor_sharing_a": {
            kind: round(float(np.median(ps[sel & (k >= 1)])), 4)
            for kind, sel in (("decode", ~rep["mixed"]), ("mixed", rep["mixed"]))
        },
        "steps_with_a_neighbour": int(rep["busy"].sum()),
        "decode_ratio_by_neighbours": _ratio_by_neighbours(x, ~rep["mixed"], k),
        "mixed_by_tokens": _mixed_by_tokens(x),
        "replay": groups,
    }


def _ratio_by_neighbours(x: dict, sel, k) -> list[dict]:  # noqa: ANN001
    """Median measured / isolated time of the selected steps per replica count and number of
    neighbours in flight."""
    import numpy as np

    out = []
    for n in sorted(set(x["n"].tolist())):
        for kk in range(n):
            m = sel & (x["n"] == n) & (k == kk)
            if m.any():
                r = float(np.median(x["dur"][m] / x["pred"][m]))
                out.append({"n": n, "k": kk, "steps": int(m.sum()), "median_ratio": round(r, 3)})
    return out


def _mixed_by_tokens(x: dict) -> list[dict]:
    """Mixed steps with a neighbour in flight, per replica count and token range: median time
    (ms) and the share of each measured slice count (``slice_labels``)."""
    import numpy as np

    lab, tok = slice_labels(x), x["rows"][:, 0] + x["rows"][:, 1]
    out = []
    for n in sorted(set(x["n"].tolist())):
        for lo, hi in ((1, 256), (256, 1536), (1536, 1 << 30)):
            m = (x["rows"][:, 0] > 0) & np.isfinite(lab) & (x["n"] == n) & (tok >= lo) & (tok < hi)
            share = {str(c): round(float((lab[m] == c).mean()), 3) for c in (1, 2, 3, 4)}
            out.append(
                {
                    "n": n,
                    "tokens": [lo, min(hi, 2048)],
                    "steps": int(m.sum()),
                    "median_ms": round(1e3 * float(np.median(x["dur"][m])), 2),
                    "slice_count_share": share,
                }
            )
    return out


def _replay_group(dur, model, n: int, workload: str, kind: str) -> dict:  # noqa: ANN001
    import numpy as np

    q = (0.5, 0.9, 0.99)
    return {
        "n": n,
        "workload": workload,
        "kind": kind,
        "steps": int(len(dur)),
        "engine_ms_q50_q90_q99": [round(1e3 * v, 3) for v in np.quantile(dur, q)],
        "model_ms_q50_q90_q99": [round(1e3 * v, 3) for v in np.quantile(model, q)],
        "engine_over_itl_slo": round(float((dur > SLO_ITL).mean()), 4),
        "model_over_itl_slo": round(float((model > SLO_ITL).mean()), 4),
        "mape_pct": round(100 * float(np.mean(np.abs(model / dur - 1))), 2),
    }


META = ("gpu", "date", "commit", "torch", "triton", "wall_s", "route_lag")


def tabulate(engine_root: Path, out: Path) -> Path:
    """The engine's cases under ``engine_root/n<N>/<case>/`` as one sweep's tables in ``out``:
    ``steps_n<N>_<workload>.csv.xz`` (every replica's step rows, the calibration format) and
    ``engine_cases.json`` (each case's figures, its workload's fingerprint and its meta; the
    one-replica cases of ``ALONE``, if run, in ``engine_alone.json``)."""
    from simulator.engine_cost_model import rows_of, write_steps

    cases, alone, steps = [], [], {}
    for nd in sorted(engine_root.glob("n*")):
        n = int(nd.name[1:])
        for cd in sorted(p for p in nd.iterdir() if (p / "meta.json").exists()):
            key = parse_case(n, cd.name)
            rec, meta = load_engine_case(cd)
            steps.setdefault((n, key.workload), []).extend(rec.replicas)
            (cases if n in LOADS else alone).append(
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
    if alone:
        (out / "engine_alone.json").write_text(json.dumps(alone, separators=(",", ":")) + "\n")
    return out / "engine_cases.json"


def compare(table: Path, seed: int = 0) -> dict:
    """Every tabulated engine case (``tabulate``'s files in ``table``) against its simulation;
    the time-slice rule's weights from ``table/device_sharing_fit.json`` (``fit-sharing``),
    the own-part fit from ``table/colocated_fit.json`` (``fit-colocated``; its slice counts
    drawn with ``seed``)."""
    from horizon.workload import load_sharegpt, tokenize_corpus
    from simulator.device_sharing import DeviceSpec, SliceFit

    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    cases = json.loads((table / "engine_cases.json").read_text())
    isolated = isolated_cost_model()
    timeslice = DeviceSpec("gpu0", "timeslice", SliceFit.from_file(table / SHARING_FIT))
    colocated = colocated_models(table / COLOCATED_FIT)
    rows, steps, all_keys = [], {}, []
    for n in sorted({c["n"] for c in cases}):
        mine = sorted((c for c in cases if c["n"] == n), key=lambda c: c["case"])
        keys = [parse_case(n, c["case"]) for c in mine]
        models = fit_cost_models(table, n, sorted({k.workload for k in keys}))
        models["isolated"] = isolated
        for key, case in zip(keys, mine):
            row, sims = compare_case(key, case, models, tokenized, timeslice)
            row, more = compare_colocated(key, row, colocated, tokenized, seed)
            sims.update(more)
            rows.append(row)
            for side, rec in sims.items():
                steps.setdefault((n, key.workload, side), []).extend(rec.replicas)
        all_keys += keys
    quantum = compare_quantum(all_keys, rows, isolated, tokenized, steps)
    return {
        "conditions": _conditions(),
        "cases": rows,
        "summary": summarize_rows(rows),
        "summary_shared_device": summarize_rows(rows, "sim_shared_device"),
        "summary_timeslice": summarize_rows(rows, "sim_timeslice"),
        **{f"summary_{side[4:]}": summarize_rows(rows, side) for side in COLOCATED_SIDES},
        **quantum,
        "step_times": step_time_table(table, steps),
    }


def compare_quantum(keys: list[CaseKey], rows: list[dict], isolated, tokenized, steps) -> dict:  # noqa: ANN001
    """Variant (e) (``experiments.cluster_quantum``) on every case: adds ``sim_quantum`` at the
    time slice chosen without the case's load, and its error, to each row, and its steps to
    ``steps``; returns the document's entries (its summary, the slices chosen, the grid)."""
    from experiments import cluster_quantum as cq

    def sim(key: CaseKey, device):  # noqa: ANN001, ANN202
        return simulate_case(key, isolated, tokenized, device=device)

    grid = cq.slice_grid(keys, sim, figures)
    index = {id(r): load_index(k) for k, r in zip(keys, rows)}
    chosen = cq.choose_slices(rows, grid, lambda r: index[id(r)], summarize_rows)
    for key, row in zip(keys, rows):
        q = chosen[load_index(key)]
        rec = sim(key, cq.quantum_device(q))
        row[cq.SIDE] = figures(rec) | {"quantum_ms": q}
        row["goodput_error_pts_quantum"] = error_pts(row, cq.SIDE)
        steps.setdefault((key.n, key.workload, cq.SIDE), []).extend(rec.replicas)
    return {
        "summary_quantum": summarize_rows(rows, cq.SIDE),
        "quantum_chosen_ms": {f"load{i}": q for i, q in sorted(chosen.items())},
        "quantum_grid": cq.grid_summary(rows, grid, summarize_rows),
    }


def colocated_models(path: Path) -> dict:
    """Every fold of the co-located own-part fit, by fold name."""
    from experiments.colocated_fit import FOLDS
    from simulator.colocated_cost_model import ColocatedCostModel

    return {f: ColocatedCostModel(path, f) for f in FOLDS}


def colocated_fold(key: CaseKey, side: str) -> str:
    """The fold that prices a case on a side of variant (d): never fitted to the case but for
    ``sim_colocated_in_sample``."""
    if side == "sim_colocated":
        return f"without_load{load_index(key)}"
    if side == "sim_colocated_other_workload":
        return f"without_{key.workload}"
    return "all"


def compare_colocated(
    key: CaseKey,
    row: dict,
    models: dict,
    tokenized,  # noqa: ANN001
    seed: int = 0,
) -> tuple:
    """Variant (d)'s simulations of a case (slice counts drawn with ``seed``), added to its
    comparison row (figures and goodput errors); returns (row, {side: ClusterRecords})."""
    sims = {}
    for side in COLOCATED_SIDES:
        m = models[colocated_fold(key, side)]
        sims[side] = simulate_case(key, m, tokenized, device=m.device("gpu0", seed=seed))
        row[side] = figures(sims[side]) | {"fold": m.fold}
        row[f"goodput_error_pts_{side[4:]}"] = error_pts(row, side)
    return row, sims


def compare_case(key: CaseKey, case: dict, models: dict, tokenized, timeslice) -> tuple:  # noqa: ANN001
    """One engine case against its four simulations: fitted to every case's co-located steps,
    fitted to the other workload's only, and the isolated replica's model on a shared GPU,
    first come first served and time-sliced. Returns (row, {side: ClusterRecords})."""
    sim = simulate_case(key, models["all"], tokenized)
    assert prompt_digest(sim) == case["prompt_digest"], (
        f"{key.name}: the regenerated workload differs from the engine's"
    )
    lowo = simulate_case(key, models[key.workload], tokenized)
    shared = simulate_case(key, models["isolated"], tokenized, device="gpu0")
    sliced = simulate_case(key, models["isolated"], tokenized, device=timeslice)
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
        "sim_timeslice": figures(sliced),
        "engine_meta": case["meta"],
    }
    row["goodput_error_pts"] = error_pts(row, "sim")
    row["goodput_error_pts_shared_device"] = error_pts(row, "sim_shared_device")
    row["goodput_error_pts_timeslice"] = error_pts(row, "sim_timeslice")
    sides = {"sim": sim, "sim_shared_device": shared, "sim_timeslice": sliced}
    return row, sides


STEP_QUANTILES = (0.5, 0.9, 0.99)


def step_time_table(table: Path, steps: dict) -> list[dict]:
    """Per replica count, workload and step kind (decode-only, mixed): step-time quantiles
    (ms) and the share of steps over the ITL SLO, the engine's (its committed step tables)
    beside each simulator's (every case's steps pooled, as the tables pool them)."""
    from simulator.engine_cost_model import read_steps, rows_of

    out = []
    for n, w in sorted({(n, w) for n, w, _ in steps}):
        sides = {"engine": read_steps(table / steps_file(n, w))[0]}
        for side in ("sim", "sim_shared_device", "sim_timeslice", *COLOCATED_SIDES, "sim_quantum"):
            sides[side] = rows_of(steps[(n, w, side)])
        for kind in ("decode", "mixed"):
            row = {"n": n, "workload": w, "kind": kind}
            for side, r in sides.items():
                row[side] = _step_stats(r, kind)
            out.append(row)
    return out


def _step_stats(rows, kind: str) -> dict:  # noqa: ANN001 - STEP_COLUMNS rows
    import numpy as np

    r = rows[(rows[:, 0] + rows[:, 1]) > 0]
    r = r[r[:, 0] > 0] if kind == "mixed" else r[r[:, 0] == 0]
    t = r[:, -1]
    return {
        "steps": int(len(t)),
        "ms": [round(1e3 * float(v), 3) for v in np.quantile(t, STEP_QUANTILES)],
        "over_itl_slo": round(float((t > SLO_ITL).mean()), 4),
    }


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
        "sim_timeslice": "the same isolated model, the replicas' steps time-sliced on the "
        "shared device (simulator.device_sharing, weights in device_sharing_fit.json)",
        "sim_colocated": "the co-located steps' own part fitted as its own cost model "
        "(simulator.colocated_cost_model, colocated_fit.json) on the time-sliced device, "
        "mixed steps' slice counts drawn (seed 0) from the shares measured at their own time; "
        "each case priced by the fold fitted without its load (every N and workload)",
        "sim_colocated_other_workload": "the same, the fold fitted to the other workload only",
        "sim_colocated_in_sample": "the same, the fold fitted to every case (in sample)",
        "sim_quantum": "the isolated model, the replicas' steps taking round-robin turns on "
        "one simulated GPU (simulator.quantum_device), the time slice chosen from "
        "experiments.cluster_quantum.QUANTA_MS on the cases at the other two loads",
        "sim_loop": "pipelined, arrivals between steps",
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", default=str(REPO / "gpu_inputs" / "cluster"))
    e.add_argument("--alone", action="store_true", help="also one replica alone (ALONE)")
    t = sub.add_parser("tabulate")
    t.add_argument("engine", help="directory of n<N>/<case>/ engine results (the GPU's output)")
    t.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity"))
    f = sub.add_parser("fit-sharing")
    f.add_argument("engine", help="directory of n<N>/<case>/ engine results (with timestamps)")
    f.add_argument("--source", required=True, help="where the engine results come from")
    f.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity" / SHARING_FIT))
    fc = sub.add_parser("fit-colocated")
    fc.add_argument("engine", help="directory of n<N>/<case>/ engine results (with timestamps)")
    fc.add_argument("--source", required=True, help="where the engine results come from")
    fc.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity" / COLOCATED_FIT))
    c = sub.add_parser("compare")
    c.add_argument("--table", default=str(REPO / "results" / "cluster_fidelity"))
    c.add_argument("--out", default=str(REPO / "results" / "cluster_fidelity"))
    c.add_argument("--seed", type=int, default=0, help="variant (d)'s slice-count draws")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        for p in export(Path(args.out), args.alone):
            print(p)
        return
    if args.cmd == "tabulate":
        print(tabulate(Path(args.engine), Path(args.out)))
        return
    if args.cmd == "fit-sharing":
        fit = fit_sharing(Path(args.engine), args.source)  # the simulator's input: floats as is
        Path(args.out).write_text(compact_json.dumps(fit, None, sort_keys=False))
        print(json.dumps({k: fit[k] for k in ("timeslice", "switch_factor_fitted")}))
        return
    if args.cmd == "fit-colocated":
        from experiments.colocated_fit import fit_colocated

        fit = fit_colocated(Path(args.engine), args.source)  # the simulator's input, as is
        Path(args.out).write_text(compact_json.dumps(fit, None, sort_keys=False))
        print(args.out)
        return
    doc = compare(Path(args.table), args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # every float as it is: at fewer digits, errors a half unit from the page's 0.1 pts flip
    (out / "cluster_fidelity.json").write_text(compact_json.dumps(doc, None, sort_keys=False))
    from experiments.cluster_fidelity_table import variants_table

    (out / "variants.md").write_text(variants_table(doc))
    print(variants_table(doc))


if __name__ == "__main__":
    main()
