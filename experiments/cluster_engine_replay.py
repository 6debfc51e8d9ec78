"""Replay cluster cases on N engine replicas (GPU), one Router in front of them.

    python -m experiments.cluster_engine_replay --manifest DIR/cluster_manifest.json --out OUT
        [--case NAME ...] [--device cpu]

Runs every case of the manifest (``experiments.cluster_manifest``) on one ``EngineCluster``
(``executor.cluster_engine``): the workers are built once (seeded random weights of the preset's
shape, the replica's KV pool, CUDA graphs) and serve every case in turn. Writes
``OUT/<case>/replica<i>/records.npz`` (numpy only) and ``OUT/<case>/meta.json`` (assignment,
routing lag, wall time, GPU, torch and triton versions, date, commit). The GPU machine has no
simpy or hydra: nothing here imports them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from executor.cluster_engine import EngineCluster
from experiments.cluster_manifest import ClusterCase, ClusterManifest
from horizon.workload.requests_file import load_requests
from horizon.workload.sessions_file import load_sessions


def replay(
    manifest: str | Path, out: str | Path, cases: list[str] | None = None, device: str | None = None
) -> list[Path]:
    """Run the manifest's cases (only ``cases`` if given); returns each case's directory.

    Raises:
        ValueError: a case named in ``cases`` is not in the manifest.
    """
    m = ClusterManifest.load(manifest)
    known = [c.name for c in m.cases]
    missing = sorted(set(cases or ()) - set(known))
    if missing:
        raise ValueError(f"--case {missing} not in the manifest (known: {known})")
    base = Path(manifest).parent
    done = []
    with EngineCluster(m.worker_specs(device)) as cluster:
        for case in m.cases:
            if cases and case.name not in cases:
                continue
            done.append(run_case(cluster, m, case, base, Path(out) / case.name))
    return done


def run_case(
    cluster: EngineCluster, m: ClusterManifest, case: ClusterCase, base: Path, out: Path
) -> Path:
    """One case on the cluster: its records per replica and its meta.json under ``out``."""
    requests = load_requests(base / case.requests) if case.requests else []
    sessions = load_sessions(base / case.sessions) if case.sessions else ()
    router = case.router.build(m.ttft_slo)
    policy = case.policy.build(m.ttft_slo)
    t0 = time.perf_counter()
    dec = case.decode_router.build(m.ttft_slo) if case.decode_router is not None else None
    rec = cluster.run(requests, sessions, router, policy, case.view_delay, case.max_time,
                      decode_router=dec)  # fmt: skip
    wall = time.perf_counter() - t0
    rec.check()
    for i, r in enumerate(rec.replicas):
        (out / f"replica{i}").mkdir(parents=True, exist_ok=True)
        r.save_npz(str(out / f"replica{i}" / "records.npz"))
    if rec.transfers is not None:
        np.savez_compressed(out / "transfers.npz", **rec.transfers)
    meta = case_meta(cluster, m, case, rec, wall)
    meta["num_requests"] = len(requests) + sum(len(s.requests) for s in sessions)
    meta["num_sessions"] = len(sessions)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    fin = [int((r.status == 0).sum()) for r in rec.replicas]
    lag = meta["route_lag"]
    print(
        f"{case.name}: {sum(fin)}/{meta['num_requests']} finished ({fin} by replica), "
        f"routing lag p50 {1e3 * lag['p50']:.2f} ms p99 {1e3 * lag['p99']:.2f} ms, {wall:.1f} s",
        flush=True,
    )
    return out


def case_meta(cluster: EngineCluster, m: ClusterManifest, case: ClusterCase, rec, wall) -> dict:  # noqa: ANN001
    """What a case's meta.json holds (JSON values only)."""
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:  # a CPU dry run's machine may lack it
        triton_version = None
    info = cluster.last_run
    assert info is not None
    replicas = [
        {"name": rec.names[i], "device": spec.device, "gpu": cluster.infos[i]["gpu"],
         "num_blocks": cluster.infos[i]["num_blocks"], "engine": dataclasses.asdict(spec.engine),
         "requests": int(rec.replicas[i].num_requests), **info.workers[i]}
        for i, spec in enumerate(cluster.specs)
    ]  # fmt: skip
    return {
        "case": case.name,
        "model": m.model if isinstance(m.model, str) else m.model_config().name,
        "router": dataclasses.asdict(case.router),
        "decode_router": dataclasses.asdict(case.decode_router) if case.decode_router else None,
        "policy": dataclasses.asdict(case.policy),
        "view_delay": case.view_delay,
        "max_time": case.max_time,
        "requests_file": case.requests,
        "sessions_file": case.sessions,
        "replicas": replicas,
        "assignment": np.asarray(rec.assignment).tolist(),
        "route_lag": info.lag_summary(),
        "route_wall_s": rec.route_wall_s,
        "reports": list(info.reports),
        "wall_s": wall,
        "gpu": sorted({r["gpu"] for r in replicas}),
        "torch": torch.__version__,
        "triton": triton_version,
        "date": time.strftime("%Y-%m-%d"),
        "commit": m.notes.get("commit"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--manifest", required=True, help="a cluster manifest (cluster_manifest.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    ap.add_argument("--device", help="every replica on this device (cpu: a slow dry run)")
    args = ap.parse_args(argv)
    replay(args.manifest, args.out, args.case, args.device)


if __name__ == "__main__":
    main()
