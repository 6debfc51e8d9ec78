"""Prefill/decode disaggregation on the engine against the simulator, on the same requests.

    python -m experiments.pd_fidelity export [--out gpu_inputs/pd]
    # on the GPU machine (one H200: both replicas' processes share it):
    for side in pd mixed; do python -m experiments.cluster_engine_replay \
        --manifest gpu_inputs/pd/$side/cluster_manifest.json --out ENGINE/$side; done
    python -m experiments.pd_fidelity compare ENGINE [--out results/pd_fidelity]
    python -m experiments.pd_fidelity colocated     # + variant (d), from the committed table
    python -m experiments.pd_fidelity reported      # + the engine driver's placement, likewise
    python -m experiments.pd_fidelity reported --variant inline   # + its copies inline
    python -m experiments.pd_fidelity reported --variant quantum  # + the device's turns
    python -m experiments.pd_fidelity reported --variant inline_quantum  # both
    python -m experiments.pd_fidelity resimulate   # every simulator row again, today's code

Cases: ShareGPT first turns (held-out half), Poisson at 2 loads x 3 seeds, on two Qwen2.5-0.5B
shape replicas (seeded random weights, 2,000 KV blocks each, fcfs) co-located on one GPU:
``pd`` (replica 0 prefills, replica 1 decodes; the KV copied between the two processes' KV
tensors through CUDA IPC, ``executor.kv_agent``) and ``mixed`` (two mixed replicas,
least-loaded: the baseline in the same GPU session). The simulator runs every case with the
same requests and routers, each replica's cost model the one-replica engine fit
(``calibration/h200_qwen2.5-0.5b_online.csv.gz``), twice: each replica on a GPU of its own
(``isolated``) and both on one GPU, steps serialized (``shared``; P/D cases also with the
engine driver's placement of handoffs, ``reported``); the P/D link is fitted to
the copies the engine measured in the same runs (``simulator.kv_link.LinkSpec.fit``).
Writes ``<out>/pd_fidelity.json``: per case and side the figures, the TTFT parts, the link
and a summary over seeds (``render``: ``<out>/table.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

import numpy as np

from experiments import compact_json

REPO = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-0.5b"
NUM_BLOCKS = 2000
ENGINE = {"num_blocks": NUM_BLOCKS, "max_model_len": 8192, "max_num_batched_tokens": 2048,
          "max_num_seqs": 256}  # fmt: skip
LOADS = (100.0, 180.0)  # requests/s offered to the pair: below and near the P/D knee
SEEDS = (0, 1, 2)
REQUESTS = 1500
SLO_TTFT, SLO_ITL = 0.25, 0.01
SIDES = {"pd": ("prefill", "decode"), "mixed": ("mixed", "mixed")}
# colocated: ``add_colocated``, variant (d); reported, inline: ``add_reported`` (P/D rows only);
# quantum: ``add_reported`` (every row); inline_quantum: ``add_reported`` (P/D rows only)
VARIANTS = ("isolated", "shared", "colocated", "reported", "inline", "quantum", "inline_quantum")
PLACED = ("reported", "inline", "quantum", "inline_quantum")
# quantum's time slice: the one the co-located cluster comparison chose, held out, at its two
# higher loads (docs/cluster.md, simulator (e)); not chosen on these cases
QUANTUM_S = 0.25e-3


def case_name(load: float, seed: int) -> str:
    return f"r{load:g}_s{seed}"


def export(out: Path) -> list[Path]:
    """One requests file per case and one manifest per side under ``out``."""
    from experiments.cluster_manifest import ClusterCase, ClusterManifest, ReplicaEntry, RouterSpec
    from horizon.workload import WorkloadConfig, build_workload, load_sharegpt, tokenize_corpus
    from horizon.workload.requests_file import save_requests

    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for load in LOADS:
        for seed in SEEDS:
            cfg = WorkloadConfig(num_requests=REQUESTS, rate=load, seed=seed,
                                 conversations="held_out", split_test_fraction=0.5)  # fmt: skip
            save_requests(
                build_workload(cfg, tokenized).requests, out / f"{case_name(load, seed)}.json.xz"
            )
    written = []
    for side, roles in SIDES.items():
        d = out / side
        d.mkdir(exist_ok=True)
        router = RouterSpec("round_robin" if side == "pd" else "least_loaded")
        dec = RouterSpec("least_kv") if side == "pd" else None
        cases = tuple(ClusterCase(case_name(x, s), router, requests=f"../{case_name(x, s)}.json.xz",
                                  decode_router=dec) for x in LOADS for s in SEEDS)  # fmt: skip
        replicas = tuple(ReplicaEntry("cuda", name=f"{r}{i}", role=r) for i, r in enumerate(roles))
        m = ClusterManifest(MODEL, replicas, cases, dict(ENGINE), SLO_TTFT, {"commit": commit})
        m.save(d / "cluster_manifest.json")
        written.append(d / "cluster_manifest.json")
    return written


def fit_link(engine_root: Path):  # noqa: ANN201 - simulator.kv_link.LinkSpec
    """The link fitted to every P/D case's measured copies: seconds against KV bytes."""
    from horizon.model_shape import model_shape
    from simulator.kv_link import LinkSpec

    per_block = 16 * model_shape(MODEL).kv_bytes_per_token()
    nbytes, secs = [], []
    for f in sorted((engine_root / "pd").glob("*/transfers.npz")):
        with np.load(f) as z:
            nbytes.extend((z["num_blocks"] * per_block).tolist())
            secs.extend(z["copy_s"].tolist())
    return LinkSpec.fit("same_gpu_ipc", nbytes, secs, f"{engine_root}: the engine's own copies")


def simulate(side: str, requests, link, device, cost_model=None, placement="live"):  # noqa: ANN001, ANN201
    """A case on the simulator; ``device``: None (a GPU each), a name (shared, FCFS) or a
    ``DeviceSpec``; ``cost_model``: every replica's, instead of the one-replica engine fit;
    ``placement``: the handoffs' (``simulator.reported_placement``)."""
    from dataclasses import replace

    from experiments.cluster_setup import ReplicaSpec, simulate_cluster
    from horizon.cluster import make_router

    cache: dict = {}
    named = device if isinstance(device, str) else None  # ReplicaSpec takes a name
    setups = [ReplicaSpec(MODEL, num_blocks=NUM_BLOCKS, role=r, device=named).setup(None, cache)
              for r in SIDES[side]]  # fmt: skip
    if cost_model is not None or not (device is None or isinstance(device, str)):
        model = cost_model or setups[0].cost_model
        setups = [replace(s, cost_model=model, device=device) for s in setups]
    pd = side == "pd"
    return simulate_cluster(
        setups,
        make_router("round_robin" if pd else "least_loaded"),
        requests,
        decode_router=make_router("least_kv") if pd else None,
        kv_link=link if pd else None,
        placement=placement,
    )


def figures(rec) -> dict:  # noqa: ANN001 - ClusterRecords
    """Goodput, latency means and p99s, and (P/D) the TTFT parts' means."""
    from horizon.cluster.disagg_metrics import ttft_breakdown
    from horizon.metrics import summarize
    from horizon.request import SLO

    m = summarize(rec.merged(), slo=SLO(SLO_TTFT, SLO_ITL))
    out = {k: m[k] for k in ("ttft_mean", "ttft_p99", "itl_mean", "itl_p99", "e2e_mean")}
    out["goodput"] = m["goodput_lifetime"]
    out["replicas"] = [replica_load(r) for r in rec.replicas]
    if rec.transfers is not None:
        out["ttft_parts"] = ttft_breakdown(rec)
        if "copy_s" in rec.transfers:
            out["copy_mean"] = float(np.nanmean(rec.transfers["copy_s"]))
        if "placed" in rec.transfers:
            out["placement"] = placement_lag(rec)
    return out


def placement_lag(rec) -> dict:  # noqa: ANN001 - ClusterRecords of a P/D run
    """How handoffs were taken: refused placements, and from a transfer's last placement to
    its start (the target reserving the blocks) the mean seconds and the mean number of the
    target's steps that ended meanwhile (0: taken at the target's next boundary, before it
    planned again; 1: after one more plan of its own). Step ends, not starts: a plan's
    recorded start is the clock reading before the boundary's admissions, on both backends."""
    t = rec.transfers
    ok = np.isfinite(t["start"]) & np.isfinite(t["placed"])
    ends = [rec.replicas[d].step_end for d in range(rec.num_replicas)]
    ended = [
        np.searchsorted(ends[d], s, "right") - np.searchsorted(ends[d], p, "right")
        for d, p, s in zip(t["dst"][ok], t["placed"][ok], t["start"][ok])
    ]
    return {
        "refusals": int(t["refusals"].sum()),
        "lag_mean": float(np.mean(t["start"][ok] - t["placed"][ok])) if ok.any() else math.nan,
        "steps_between": float(np.mean(ended)) if ended else math.nan,
    }


def replica_load(r) -> dict:  # noqa: ANN001 - one replica's RunRecords
    """How full a replica ran: its steps' mean running requests and KV blocks used (over the
    steps that computed any token), the most waiting, its preemptions and the requests
    preempted there."""
    busy = (r.prefill_tokens + r.decode_tokens) > 0
    return {
        "steps": int(len(r.step_start)),
        "running_mean": float(r.num_running[busy].mean()) if busy.any() else 0.0,
        "kv_used_mean": float(r.kv_used_blocks[busy].mean()) if busy.any() else 0.0,
        "waiting_max": int(r.num_waiting.max()) if len(r.num_waiting) else 0,
        "preemptions": int(r.num_preempted[r.num_preempted > 0].sum()),
        "requests_preempted": int((r.num_preemptions > 0).sum()),
    }


def compare(engine_root: Path, out: Path) -> dict:
    """Every case on both sides: engine figures beside the simulator's (isolated, shared)."""
    from experiments.cluster_fidelity import load_engine_case
    from horizon.workload.requests_file import load_requests

    link = fit_link(engine_root)
    inputs = REPO / "gpu_inputs" / "pd"
    rows = []
    for side in SIDES:
        for load in LOADS:
            for seed in SEEDS:
                name = case_name(load, seed)
                rec, meta = load_engine_case(engine_root / side / name)
                requests = load_requests(inputs / f"{name}.json.xz")
                row = {
                    "side": side,
                    "load": load,
                    "seed": seed,
                    "engine": figures(rec),
                    "meta": {k: meta[k] for k in ("gpu", "torch", "triton", "date", "commit")},
                    "requests_digest": requests_digest(requests),
                }
                for variant, device in (("isolated", None), ("shared", "gpu0")):
                    row[variant] = figures(simulate(side, requests, link, device))
                if side == "pd":  # the engine driver's placement (``add_reported``)
                    row["reported"] = figures(
                        simulate(side, requests, link, "gpu0", placement="reported")
                    )
                rows.append(row)
    doc = {"link": {"bandwidth_Bps": link.bandwidth, "latency_s": link.latency_s},
           "slo": {"ttft": SLO_TTFT, "itl": SLO_ITL}, "rows": rows}  # fmt: skip
    doc["summary"] = summary(doc)
    out.mkdir(parents=True, exist_ok=True)
    _write_doc(doc, out)
    (out / "table.md").write_text(render(doc["summary"]))
    return doc


def case_requests(load: float, seed: int, tokenized):  # noqa: ANN001, ANN201
    """A case's requests, as ``export`` wrote them (the same seeded build)."""
    from horizon.workload import WorkloadConfig, build_workload

    cfg = WorkloadConfig(num_requests=REQUESTS, rate=load, seed=seed,
                         conversations="held_out", split_test_fraction=0.5)  # fmt: skip
    return build_workload(cfg, tokenized).requests


def requests_digest(requests) -> str:  # noqa: ANN001 - a sequence of horizon.request.Request
    """SHA-256 of the requests' arrival times, prompt lengths and output lengths, in order."""
    import hashlib

    arrays = (
        np.array([r.arrival_time for r in requests], np.float64),
        np.array([r.num_prompt_tokens for r in requests], np.int64),
        np.array([r.true_output_tokens for r in requests], np.int64),
    )
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


def row_requests(row: dict, tokenized):  # noqa: ANN001, ANN201
    """A committed row's requests built again; ValueError where they are not the ones the
    engine ran (``requests_digest``, written by ``compare``)."""
    requests = case_requests(row["load"], row["seed"], tokenized)
    if requests_digest(requests) != row["requests_digest"]:
        raise ValueError(f"{row['side']} {row['load']:g}/{row['seed']}: requests differ")
    return requests


def add_colocated(table: Path, fold: str = "all") -> dict:
    """Variant (d) of docs/cluster.md on every case of the committed ``pd_fidelity.json``
    (its engine figures and fitted link; the requests built again as ``export`` built them):
    both replicas on one time-sliced GPU, each step's own part priced by
    ``simulator.colocated_cost_model`` (fold ``fold``, fitted to the mixed replicas of the
    cluster comparison, none of these cases) and a mixed step's slices drawn. Adds the
    ``colocated`` figures to each row and rewrites the summary and ``table.md``. Raises
    ValueError where the rebuilt requests are not the ones the engine ran (``row_requests``)."""
    doc, link, tokenized = _open_table(table)
    for row in doc["rows"]:
        row["colocated"] = _colocated(row, row_requests(row, tokenized), link, fold)
    return _finish(doc, table)


def add_reported(table: Path, variant: str = "reported") -> dict:
    """The P/D cases of the committed ``pd_fidelity.json`` with handoffs placed as the
    engine's driver places them (``placement="reported"``: on the decode replica's latest
    step-end free blocks, taken or refused at its next step boundary), both replicas on one
    GPU, steps serialized (as ``shared``). ``variant`` ``reported``: the KV over the link
    fitted to the engine's copies; ``inline``: copied behind the decode replica's step in
    flight at the idle copy's speed (``Placement.copy``; ``calibration/h200_kv_transfer.json``);
    ``quantum``: over the link, the GPU's turns simulated round robin in ``QUANTUM_S`` slices
    (``simulator.quantum_device``) instead of serialized steps, on the mixed rows too;
    ``inline_quantum``: copied inline on those turns (each copy the decode replica's device
    work behind its step in flight).
    Adds the variant's figures to each row it covers and rewrites the summary and
    ``table.md``; checks the rebuilt requests as ``add_colocated``."""
    if variant not in PLACED:
        raise ValueError(f"add_reported: variant must be one of {PLACED}, got {variant!r}")
    doc, link, tokenized = _open_table(table)
    for row in doc["rows"]:
        if row["side"] == "pd" or variant == "quantum":
            row[variant] = _placed(variant, row_requests(row, tokenized), link, row["side"])
    return _finish(doc, table)


def resimulate(table: Path) -> dict:
    """Every simulator variant of the committed ``pd_fidelity.json`` run again with this
    code and its default cost models (after a cost model changes), on each row's requests
    built again (checked as ``add_colocated``) and the table's link; the engine's figures
    stay. Rewrites the summary and ``table.md``."""
    doc, link, tokenized = _open_table(table)
    for row in doc["rows"]:
        requests = row_requests(row, tokenized)
        for variant, device in (("isolated", None), ("shared", "gpu0")):
            row[variant] = figures(simulate(row["side"], requests, link, device))
        for variant in PLACED:
            if variant in row:
                row[variant] = _placed(variant, requests, link, row["side"])
        if "colocated" in row:
            row["colocated"] = _colocated(row, requests, link, row["colocated"]["fold"])
    return _finish(doc, table)


def _open_table(table: Path):  # noqa: ANN202 - (doc, LinkSpec, tokenized corpus)
    from horizon.workload import load_sharegpt, tokenize_corpus
    from simulator.kv_link import LinkSpec

    doc = json.loads((table / "pd_fidelity.json").read_text())
    link = LinkSpec("same_gpu_ipc", doc["link"]["bandwidth_Bps"], doc["link"]["latency_s"])
    tokenized = tokenize_corpus(load_sharegpt(), REPO / "data" / "cache" / "sharegpt_qwen2.5.npz")
    return doc, link, tokenized


def _colocated(row: dict, requests, link, fold: str) -> dict:  # noqa: ANN001
    from simulator.colocated_cost_model import ColocatedCostModel

    model = ColocatedCostModel(fold=fold)
    device = model.device("gpu0", seed=row["seed"])
    out = figures(simulate(row["side"], requests, link, device, model))
    out["fold"] = fold
    return out


def _placed(variant: str, requests, link, side: str = "pd") -> dict:  # noqa: ANN001
    from simulator.device_sharing import DeviceSpec
    from simulator.kv_link import measured_link
    from simulator.reported_placement import Placement

    placement, copy_link, device = Placement("reported"), link, "gpu0"
    if variant in ("inline", "inline_quantum"):
        placement = Placement("reported", copy="inline")
        copy_link = measured_link(str(REPO / "calibration" / "h200_kv_transfer.json"), MODEL)
    if variant in ("quantum", "inline_quantum"):
        device = DeviceSpec("gpu0", "quantum", quantum_s=QUANTUM_S)
    return figures(simulate(side, requests, copy_link, device, placement=placement))


def _finish(doc: dict, table: Path) -> dict:
    doc["summary"] = summary(doc)
    _write_doc(doc, table)
    (table / "table.md").write_text(render(doc["summary"]))
    return doc


def _write_doc(doc: dict, where: Path) -> None:
    """``pd_fidelity.json`` with every float as it is (``add_colocated`` reads its link back as
    an input)."""
    (where / "pd_fidelity.json").write_text(compact_json.dumps(doc, None, sort_keys=False))


def summary(doc: dict) -> list[dict]:
    """Per side, load and simulator variant: seed means of engine and simulator figures, the
    goodput error (points) and the relative errors of the latency means; P/D rows add the
    transfer part's simulated mean over the engine's measured one."""
    out = []
    for side in SIDES:
        for load in LOADS:
            rows = [r for r in doc["rows"] if r["side"] == side and r["load"] == load]
            for variant in VARIANTS:
                if not all(variant in r for r in rows):
                    continue
                row = {"side": side, "load": load, "sim": variant, "seeds": len(rows)}
                for k in ("goodput", "ttft_mean", "itl_mean", "e2e_mean"):
                    eng = float(np.mean([r["engine"][k] for r in rows]))
                    sim = float(np.mean([r[variant][k] for r in rows]))
                    row[k] = {"engine": eng, "sim": sim}
                    errs = [r[variant][k] - r["engine"][k] for r in rows]
                    if k == "goodput":
                        row[k]["max_err_pts"] = 100 * float(np.max(np.abs(errs)))
                    else:
                        rel = [e / r["engine"][k] for e, r in zip(errs, rows)]
                        row[k]["max_err"] = float(np.max(np.abs(rel)))
                if side == "pd":
                    row.update(_pd_parts(rows, variant))
                out.append(row)
    return out


def _pd_parts(rows: list[dict], variant: str) -> dict:
    """Transfer part simulated over measured, per seed; kv_wait and first_decode means."""
    eng = [r["engine"]["ttft_parts"] for r in rows]
    sim = [r[variant]["ttft_parts"] for r in rows]
    out: dict = {
        "transfer_sim_over_engine": [s["transfer"] / e["transfer"] for s, e in zip(sim, eng)]
    }
    for part in ("kv_wait", "first_decode"):
        out[part] = {"engine": float(np.mean([e[part] for e in eng])),
                     "sim": float(np.mean([s[part] for s in sim]))}  # fmt: skip
    return out


def render(summary_rows: list[dict]) -> str:
    """The summary as a markdown table (figures only)."""
    head = (
        "| side | load (req/s) | sim | goodput engine / sim (max err, pts) | mean TTFT ms "
        "engine / sim (max err) | mean ITL ms engine / sim (max err) | transfer sim / engine |"
    )
    lines = [head, "|" + "---|" * 7]
    for r in summary_rows:
        g, t, i = r["goodput"], r["ttft_mean"], r["itl_mean"]
        tr = r.get("transfer_sim_over_engine")
        tr_s = ", ".join(f"{x:.2f}" for x in tr) if tr else ""
        lines.append(
            f"| {r['side']} | {r['load']:g} | {r['sim']} | {g['engine']:.3f} / {g['sim']:.3f} "
            f"({g['max_err_pts']:.1f}) | {1e3 * t['engine']:.2f} / {1e3 * t['sim']:.2f} "
            f"({100 * t['max_err']:.0f}%) | {1e3 * i['engine']:.2f} / {1e3 * i['sim']:.2f} "
            f"({100 * i['max_err']:.0f}%) | {tr_s} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", default=str(REPO / "gpu_inputs" / "pd"))
    c = sub.add_parser("compare")
    c.add_argument("engine")
    c.add_argument("--out", default=str(REPO / "results" / "pd_fidelity"))
    a = sub.add_parser("colocated", help="add variant (d) to the committed table")
    a.add_argument("--table", default=str(REPO / "results" / "pd_fidelity"))
    a.add_argument("--fold", default="all")
    p = sub.add_parser("reported", help="add the engine driver's placement to the committed table")
    p.add_argument("--table", default=str(REPO / "results" / "pd_fidelity"))
    p.add_argument("--variant", default="reported", choices=PLACED)
    r = sub.add_parser("resimulate", help="every simulator row of the committed table again")
    r.add_argument("--table", default=str(REPO / "results" / "pd_fidelity"))
    args = ap.parse_args(argv)
    if args.cmd == "export":
        for p in export(Path(args.out)):
            print(p)
    elif args.cmd == "colocated":
        print(render(add_colocated(Path(args.table), args.fold)["summary"]))
    elif args.cmd == "reported":
        print(render(add_reported(Path(args.table), args.variant)["summary"]))
    elif args.cmd == "resimulate":
        print(render(resimulate(Path(args.table))["summary"]))
    else:
        compare(Path(args.engine), Path(args.out))


if __name__ == "__main__":
    main()
