"""The engine's cluster on the CPU: a Router over two tiny-engine worker processes (torch
attention, one thread each), fed online arrivals by the driver on the shared wall clock."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from executor.cluster_engine import EngineCluster
from executor.cluster_worker import PolicySpec, WorkerSpec, request_from_wire, request_to_wire
from executor.engine import EngineConfig
from executor.model.testing import tiny_config, tiny_hf_config
from executor.remote_replica import RemoteReplica
from horizon.cluster import Snapshot, make_router
from horizon.request import SLO, Request
from horizon.workload.requests_file import save_requests
from horizon.workload.sessions import Session
from horizon.workload.sessions_file import load_sessions, save_sessions

ENGINE = {"num_blocks": 200, "block_size": 4, "max_num_batched_tokens": 32, "max_num_seqs": 4,
          "max_model_len": 128}  # fmt: skip
PREFIX = 24  # six blocks of 4


@pytest.fixture(scope="module")
def cluster():
    specs = [
        WorkerSpec(tiny_config(), EngineConfig(**ENGINE), "cpu", f"cpu{i}", weight_std=0.2)
        for i in range(2)
    ]
    with EngineCluster(specs, poll_s=0.02) as c:
        yield c


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, 512, n).tolist()


def prefix_workload() -> tuple[list[Request], list[int]]:
    """Four groups sharing a 24-token prefix: each group's first request at 0-0.03 s, then four
    more per group from 0.5 s (long after the first ones finished), group by group. Returns the
    requests and each request's group."""
    rng = np.random.default_rng(0)
    prefixes = [_ids(rng, PREFIX) for _ in range(4)]
    groups = [0, 1, 2, 3] + [g for g in range(4) for _ in range(4)]
    times = [0.01 * k for k in range(4)] + [0.5 + 0.02 * k for k in range(16)]
    reqs = []
    for rid, (g, t) in enumerate(zip(groups, times)):
        ids = prefixes[g] + _ids(rng, int(rng.integers(2, 7)))
        reqs.append(Request(rid, t, len(ids), 8, int(rng.integers(3, 6)),
                            prompt_token_ids=tuple(ids)))  # fmt: skip
    return reqs, groups


def test_workers_share_the_drivers_clock(cluster):
    """perf_counter is one machine-wide monotonic clock: each worker's reading falls between
    the driver's readings before and after the ping."""
    info = time.get_clock_info("perf_counter")
    assert info.monotonic
    if sys.platform.startswith("linux"):
        assert "CLOCK_MONOTONIC" in info.implementation
    assert len(cluster.clock_checks) == 2
    for t0, tw, t1 in cluster.clock_checks:
        assert t0 <= tw <= t1
    assert [i["num_blocks"] for i in cluster.infos] == [200, 200]


def test_round_robin_alternates_and_every_request_finishes_once(cluster):
    reqs, groups = prefix_workload()
    rec = cluster.run(reqs, (), make_router("round_robin"), "fcfs")
    rec.check()
    assert rec.assignment.tolist() == [k % 2 for k in range(20)]  # ids are in arrival order
    assert [r.num_requests for r in rec.replicas] == [10, 10]
    merged = rec.merged()
    assert (merged.status == 0).all() and merged.num_requests == 20
    np.testing.assert_allclose(merged.arrival_time, [r.arrival_time for r in reqs])
    assert (merged.first_admit_time >= merged.arrival_time).all()  # one clock for all
    first = {g: int(rec.assignment[g]) for g in range(4)}
    assert any(rec.assignment[k] != first[groups[k]] for k in range(4, 20))  # blind to prefixes
    lag = cluster.last_run.lag_summary()
    assert lag["count"] == 20 and 0 <= lag["p50"] <= lag["max"] < 0.5
    assert all(n > 0 for n in cluster.last_run.reports)


def test_prefix_aware_follows_the_kv_events(cluster):
    """Once the first request of a group has run, its replica's KV events reach the router:
    every later request of the group goes there and hits the cache."""
    reqs, groups = prefix_workload()
    rec = cluster.run(reqs, (), make_router("prefix_aware"), "fcfs")
    rec.check()
    merged = rec.merged()
    assert (merged.status == 0).all()
    first = {g: int(rec.assignment[g]) for g in range(4)}
    later = range(4, 20)
    assert [int(rec.assignment[k]) for k in later] == [first[groups[k]] for k in later]
    assert (merged.cached_tokens[list(later)] >= PREFIX).all()
    assert (merged.cached_tokens[:4] == 0).all()


def test_prefix_aware_blind_with_views_older_than_the_run(cluster):
    """With views 5 s late the router sees neither load nor KV events: every hit is 0, so
    prefix_aware falls back to least-loaded, which alternates by routed count."""
    reqs, _ = prefix_workload()
    rec = cluster.run(reqs, (), make_router("prefix_aware"), "fcfs", view_delay=5.0)
    rec.check()
    assert rec.assignment.tolist() == [k % 2 for k in range(20)]


def make_sessions(thinks=((0.05, 0.1), (0.08, 0.0))) -> list[Session]:
    """Two 3-turn sessions; turn k + 1's prompt is turn k's prompt, its reply and new text."""
    rng = np.random.default_rng(1)
    out, rid = [], 0
    for s, (start, think) in enumerate(zip((0.0, 0.02), thinks)):
        prompt, turns = _ids(rng, 10), []
        for k in range(3):
            n_out = int(rng.integers(3, 6))
            reply = tuple(_ids(rng, n_out))
            arrival = start if k == 0 else 0.0
            turns.append(Request(rid, arrival, len(prompt), 8, n_out, slo=SLO(1.0, 0.5),
                                 prompt_token_ids=tuple(prompt), conversation_id=s,
                                 turn_index=k, output_token_ids=reply))  # fmt: skip
            prompt = prompt + list(reply) + _ids(rng, 3)
            rid += 1
        out.append(Session(s, tuple(turns), tuple(think), start))
    return out


def test_closed_loop_sessions_release_each_turn_after_the_last_finished(cluster):
    sessions = make_sessions()
    rec = cluster.run([], sessions, make_router("sticky"), "fcfs")
    rec.check()
    merged = rec.merged()
    assert merged.num_requests == 6 and (merged.status == 0).all()
    row = {int(rid): i for i, rid in enumerate(merged.request_id)}
    for s in sessions:
        for a, b, think in zip(s.requests, s.requests[1:], s.think_times):
            finish = merged.tokens_of(row[a.request_id])[-1]
            arrival = merged.arrival_time[row[b.request_id]]
            assert arrival >= finish + think - 1e-9
            assert arrival == pytest.approx(finish + think, abs=1e-9)  # the finishing step's end
        home = {int(rec.assignment[r.request_id]) for r in s.requests}
        assert len(home) == 1  # sticky: one replica per conversation
        assert (merged.cached_tokens[[row[r.request_id] for r in s.requests[1:]]] > 0).all()


def test_a_turn_that_never_fits_ends_its_session(cluster):
    """Rejected on arrival by an idle worker (no step reports it): the run still ends, the
    turn rejected with its reason, its successor never sent."""
    rng = np.random.default_rng(2)
    p = _ids(rng, 200)  # + 8 output tokens > max_model_len 128
    turns = tuple(
        Request(k, 0.0, len(p) + k, 8, 4, slo=SLO(1.0, 0.5), conversation_id=0, turn_index=k,
                prompt_token_ids=tuple(p + _ids(rng, k)), output_token_ids=tuple(_ids(rng, 4)))
        for k in range(2)
    )  # fmt: skip
    out: dict = {}
    run = threading.Thread(
        target=lambda: out.update(rec=cluster.run([], [Session(0, turns, (0.05,), 0.0)],
                                                  make_router("sticky"), "fcfs")),
        daemon=True,
    )  # fmt: skip
    run.start()
    run.join(60)
    assert not run.is_alive(), "the run did not end"
    merged = out["rec"].merged()
    assert merged.num_requests == 1 and merged.reject_reason == ["exceeds_max_model_len"]


def test_max_time_cuts_the_run(cluster):
    rng = np.random.default_rng(2)
    reqs = [Request(i, t, 8, 120, 120, prompt_token_ids=tuple(_ids(rng, 8)))
            for i, t in enumerate([0.0, 0.0, 5.0])]  # fmt: skip
    t0 = time.perf_counter()
    policies = ["fcfs", PolicySpec("sjf_prompt")]  # one per replica
    rec = cluster.run(reqs, (), make_router("least_loaded"), policies, max_time=0.05)
    assert time.perf_counter() - t0 < 3.0
    rec.check()
    assert rec.assignment.tolist()[2] == -1  # after max_time: never arrived
    merged = rec.merged()
    assert merged.num_requests == 2 and (merged.status == 2).all()  # cut off, unfinished
    assert merged.num_output_tokens.sum() > 0


def test_sessions_file_round_trip(tmp_path):
    sessions = make_sessions()
    for name in ("s.json", "s.json.gz"):
        save_sessions(sessions, tmp_path / name)
        back = load_sessions(tmp_path / name)
        assert len(back) == 2
        for a, b in zip(sessions, back):
            assert (a.session_id, a.start, a.think_times) == (b.session_id, b.start, b.think_times)
            for x, y in zip(a.requests, b.requests, strict=True):
                assert request_to_wire(x) == request_to_wire(y)
    save_requests(sessions[0].requests, tmp_path / "r.json")
    with pytest.raises(ValueError, match="horizon-sessions"):
        load_sessions(tmp_path / "r.json")


def test_wire_and_remote_replica_contracts():
    r = make_sessions()[0].requests[1]
    assert request_to_wire(request_from_wire(request_to_wire(r))) == request_to_wire(r)
    rem = RemoteReplica(0, "r0", None, 10, 4, 32, True)
    assert rem.history[0].kv_free_blocks == 10 and rem.history[0].time == -np.inf
    rem.report(Snapshot(1.0, 1, 0, 5, 2, 8, 0, 0.01, np.nan, np.nan), [(1, 7)])
    with pytest.raises(ValueError, match="report at 0.5"):
        rem.report(Snapshot(0.5, 0, 0, 0, 0, 10, 0, 0.0, np.nan, np.nan), None)
    rem.check_integrity()
    assert list(rem.kv_events) == [(1.0, [(1, 7)])] and rem.reports == 1
    with pytest.raises(ValueError, match="WorkerSpec.device"):
        WorkerSpec(device="gpu0")


def test_replay_entry_point_runs_a_manifest(tmp_path):
    """The GPU entry point end to end on the CPU: a manifest with an inline tiny model, a
    requests case and a sessions case; records per replica and meta.json per case."""
    from experiments.cluster_engine_replay import main
    from horizon.metrics.records import RunRecords

    reqs, _ = prefix_workload()
    save_requests(reqs[:8], tmp_path / "requests.json.gz")
    save_sessions(make_sessions(), tmp_path / "sessions.json")
    manifest = {
        "format": "horizon-cluster-manifest", "version": 1,
        "model": tiny_hf_config(), "engine": ENGINE, "replicas": 2, "device": "cpu",
        "cases": [
            {"name": "rr", "requests": "requests.json.gz", "router": "round_robin"},
            {"name": "chat", "sessions": "sessions.json",
             "router": {"name": "prefix_aware", "options": {"threshold": 4}},
             "policy": {"name": "sjf_prompt"}},
        ],
        "notes": {"commit": "abc"},
    }  # fmt: skip
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    main(["--manifest", str(tmp_path / "m.json"), "--out", str(tmp_path / "out")])
    for case, n in (("rr", 8), ("chat", 6)):
        meta = json.loads((tmp_path / "out" / case / "meta.json").read_text())
        assert meta["commit"] == "abc" and meta["num_requests"] == n
        assert meta["route_lag"]["count"] == n and len(meta["assignment"]) == n
        parts = [RunRecords.load_npz(str(tmp_path / "out" / case / f"replica{i}" / "records.npz"))
                 for i in range(2)]  # fmt: skip
        assert sum(p.num_requests for p in parts) == n
        assert all((p.status == 0).all() for p in parts)
    assert meta["router"] == {"name": "prefix_aware", "options": {"threshold": 4}}
    assert meta["policy"]["name"] == "sjf_prompt" and meta["gpu"] == ["cpu"]
    assert [r["num_blocks"] for r in meta["replicas"]] == [200, 200]


def test_the_entry_point_needs_neither_simpy_nor_hydra():
    code = (
        "import sys\n"
        "for m in ('simpy', 'hydra', 'omegaconf'): sys.modules[m] = None\n"
        "import experiments.cluster_engine_replay\n"
        "from experiments.cluster_manifest import _case\n"
        "c = _case({'name': 'a', 'requests': 'r.json', 'router': 'least_kv', 'policy': 'fcfs'})\n"
        "print(type(c.router.build(1.0)).__name__, c.policy.build(1.0).name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LeastKV", "fcfs"]
