"""Prefill/decode disaggregation on the engine's cluster, on the CPU: tiny-engine workers in
processes, a prefill replica's KV blocks copied into a decode replica's KV tensor through
shared memory (``executor.kv_copy``), placed by the cluster's own ``Handoffs``."""

from __future__ import annotations

import numpy as np
import pytest

from executor.cluster_engine import EngineCluster
from executor.cluster_worker import WorkerSpec, build_engine
from executor.engine import EngineConfig
from executor.model.testing import tiny_config
from horizon.cluster import make_router
from horizon.cluster.disagg_metrics import ttft_parts
from horizon.metrics.records import STATUS_HANDED_OFF, STATUS_UNFINISHED
from horizon.request import Request

ENGINE = {"num_blocks": 60, "block_size": 4, "max_num_batched_tokens": 32, "max_num_seqs": 4,
          "max_model_len": 128}  # fmt: skip


def _spec(role: str, i: int, **engine) -> WorkerSpec:
    cfg = EngineConfig(**{**ENGINE, **engine})
    return WorkerSpec(tiny_config(), cfg, "cpu", f"{role}{i}", role, weight_std=0.2)


@pytest.fixture(scope="module")
def pd():
    specs = [_spec("prefill", 0), _spec("decode", 1), _spec("decode", 2, num_blocks=24)]
    with EngineCluster(specs, poll_s=0.02) as c:
        yield c


def workload(n: int = 24, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    reqs = []
    for rid in range(n):
        p = int(rng.integers(2, 40))
        ids = tuple(rng.integers(0, 512, p).tolist())
        reqs.append(Request(rid, 0.02 * rid, p, 16, int(rng.integers(2, 12)),
                            prompt_token_ids=ids))  # fmt: skip
    return reqs


def test_handoffs_decode_the_same_tokens_as_one_engine(pd):
    """Every request is prefilled on replica 0 and decoded on 1 or 2 from the copied KV: the
    greedy tokens are those of a single engine serving the request end to end."""
    reqs = workload()
    rec = pd.run(reqs, (), make_router("round_robin"), "fcfs",
                 decode_router=make_router("least_kv"), check_every=1)  # fmt: skip
    rec.check()
    merged = rec.merged()
    assert merged.num_requests == len(reqs) and (merged.status == 0).all()
    np.testing.assert_array_equal(merged.num_output_tokens, [r.true_output_tokens for r in reqs])
    t = rec.transfers
    assert sorted(t["request_id"].tolist()) == list(range(len(reqs)))
    assert set(t["src"].tolist()) == {0} and set(t["dst"].tolist()) <= {1, 2}
    assert np.all(t["num_tokens"] == [reqs[i].num_prompt_tokens - 1 for i in t["request_id"]])
    assert np.all((t["ready"] <= t["start"]) & (t["start"] <= t["end"]))
    assert np.isin(t["ready"], rec.replicas[0].step_end).all()  # KV ready: its step's end
    assert np.all((t["ready"] <= t["placed"]) & (t["placed"] <= t["start"]))
    assert np.all(t["refusals"] >= 0)
    assert np.all((t["copy_s"] > 0) & (t["copy_s"] <= t["end"] - t["start"] + 1e-9))
    parts = ttft_parts(rec)
    for k in ("queueing", "prefill", "kv_wait", "transfer"):
        assert np.all(parts[k] >= -1e-9), k
    # a step's recorded start is the loop's one clock read, taken before the boundary's imports
    # are copied: the first decode part may be short of zero by that boundary's admission work
    assert np.all(parts["first_decode"] >= -0.05)
    outputs = {}
    for w in pd.last_run.workers[1:]:
        outputs.update(w["outputs"])
    engine, _ = build_engine(_spec("mixed", 9))
    engine.run_offline([Request(r.request_id, 0.0, r.num_prompt_tokens, r.max_output_tokens,
                                r.true_output_tokens, prompt_token_ids=r.prompt_token_ids)
                        for r in reqs])  # fmt: skip
    assert outputs == engine.outputs


def test_a_decode_replica_never_takes_what_it_cannot_hold(pd):
    """Replica 2's 24 blocks hold few requests at once and replica 1 is offered first by
    round robin over the fitting ones; every request still finishes, decoded where it fit,
    and the prefill replica released every handed-off request's blocks."""
    reqs = workload(40, seed=1)
    rec = pd.run(reqs, (), make_router("round_robin"), "fcfs",
                 decode_router=make_router("round_robin"), check_every=1)  # fmt: skip
    rec.check()
    merged = rec.merged()
    assert (merged.status == 0).all()
    t = rec.transfers
    assert np.isfinite(t["end"]).all() and {1, 2} == set(t["dst"].tolist())
    assert rec.replicas[2].kv_used_blocks.max() <= 24
    assert pd.last_run.workers[0]["handed"] == 0  # every prefilled request's blocks released
    with pytest.raises(ValueError, match="decode_router"):
        pd.run(reqs[:2], (), make_router("round_robin"), "fcfs")


class _Inbox(list):
    put = list.append


def test_a_refused_import_is_placed_again_after_the_next_report():
    """The driver's side alone: a decode replica that refuses (its report was stale) gets no
    import until it reports again; the request is then placed and its blocks freed at the
    source once imported."""
    from executor.cluster_handoffs import EngineHandoffs
    from executor.remote_replica import RemoteReplica
    from executor.remote_scheduler import RemoteScheduler
    from horizon.cluster import Cluster, Snapshot

    inboxes = [_Inbox(), _Inbox()]
    remotes = []
    for i, role in enumerate(("prefill", "decode")):
        r = RemoteReplica(i, role, None, 20, 4, 32, False, role)
        r.scheduler = RemoteScheduler(i, 20, 4, 128, inboxes[i].put,
                                      lambda r=r: r.latest().kv_free_blocks)  # fmt: skip
        remotes.append(r)
    now = [0.0]
    cluster = Cluster(remotes, make_router("round_robin"), 0.0, lambda: now[0], live=False,
                      decode_router=make_router("least_kv"))  # fmt: skip
    req = Request(0, 0.0, 9, 4, 3)
    assert cluster.route(req, 0.0) == 0 and req.handoff
    h = EngineHandoffs(cluster, remotes, inboxes, {0: req}, lambda: now[0])
    h.on_handoffs(0, [(0, 8, (5, 6), 0.01)])
    assert inboxes[1][-1][0] == "import" and inboxes[1][-1][2:] == (8, 0, (5, 6))
    cluster.check_integrity()
    h.on_refused(1, 0)
    assert h.h.pending and h.refusals == 1 and len(inboxes[1]) == 1  # not offered again yet
    remotes[1].report(Snapshot(0.02, 0, 1, 0, 17, 3, 0, 0.01, np.nan, np.nan), None)
    h.on_step(1, [], [])  # 3 free blocks: the request's 3 fit now
    assert len(inboxes[1]) == 2 and not h.h.pending
    h.on_imported(1, 0, 0.03, 0.031, 0.0005)
    assert inboxes[0][-1] == ("release", 0) and h.idle
    assert h.table()["copy_s"].tolist() == [0.0005]
    cluster.check_integrity()


def test_manifest_keeps_roles_and_the_decode_router(tmp_path):
    from experiments.cluster_manifest import ClusterCase, ClusterManifest, ReplicaEntry, RouterSpec

    m = ClusterManifest("qwen2.5-0.5b", (ReplicaEntry(role="prefill"), ReplicaEntry(role="decode")),
                        (ClusterCase("c", RouterSpec("round_robin"), requests="r.json",
                                     decode_router=RouterSpec("least_kv")),))  # fmt: skip
    m.save(tmp_path / "m.json")
    back = ClusterManifest.load(tmp_path / "m.json")
    assert back.cases[0].decode_router == RouterSpec("least_kv")
    assert [s.role for s in back.worker_specs("cpu")] == ["prefill", "decode"]
    with pytest.raises(ValueError, match="WorkerSpec.role"):
        WorkerSpec(role="both")


def test_a_run_cut_at_max_time_ends_and_the_cluster_runs_again(pd):
    """Cut while the decode replicas are full (4 requests each, 30 + 94 tokens a request:
    placing all 20 takes more decode steps than a 0.2 s cut holds; 11-12 placed of 17-19
    handed off on this project's machine at its fastest, where 60-token outputs placed 17-20
    of 20): the run ends with handoffs still pending (never placed: their prefill rows alone,
    unfinished), transfers in flight done, the records whole, and the next run on the same
    workers complete."""
    rng = np.random.default_rng(0)
    reqs = [Request(i, 0.01 * i, 30, 94, 94, prompt_token_ids=tuple(rng.integers(0, 512, 30)
                    .tolist())) for i in range(20)]  # fmt: skip
    rec = pd.run(reqs, (), make_router("round_robin"), "fcfs", max_time=0.2,
                 decode_router=make_router("least_kv"), check_every=1)  # fmt: skip
    rec.check()
    merged, t = rec.merged(), rec.transfers
    assert set(merged.status.tolist()) <= {0, STATUS_UNFINISHED}
    assert (merged.status == STATUS_UNFINISHED).any()
    handed = np.flatnonzero(rec.replicas[0].status == STATUS_HANDED_OFF)
    assert len(handed) > len(t["request_id"])  # some handed off were never placed
    assert np.all(np.isfinite(t["end"]))  # what was placed was copied
    again = pd.run(workload(), (), make_router("round_robin"), "fcfs",
                   decode_router=make_router("least_kv"), check_every=1)  # fmt: skip
    again.check()
    assert (again.merged().status == 0).all()


def test_a_stopped_prefill_worker_takes_releases_until_close():
    """After its loop has ended (a max_time cut), a prefill worker's inbox still brings the
    releases of transfers that were in flight; it frees each and waits for "close", which the
    driver sends after the last (so none is left for the next run's first command)."""
    import queue

    from executor.cluster_worker import InboxArrivals

    class Agent:
        def __init__(self) -> None:
            self.released: list[int] = []

        def release(self, rid: int) -> None:
            self.released.append(rid)

    inbox: queue.Queue = queue.Queue()
    agent = Agent()
    arrivals = InboxArrivals(inbox, None, 0.01, agent)  # type: ignore[arg-type]
    for msg in (("release", 3), ("release", 5), ("close",)):
        inbox.put(msg)
    arrivals.until_close()
    assert agent.released == [3, 5]
    assert inbox.empty()


def test_a_prefill_agent_reports_a_handoff_only_once_its_step_is_over():
    """A pipelined loop updates step N+1 (handing its requests off) when it submits it, while
    the GPU still writes their KV: the agent reports them at N+1's end, not at the update."""
    from types import SimpleNamespace

    from executor.kv_agent import KVAgent

    sent: list[tuple] = []
    new: list[tuple[Request, float]] = []
    r = Request(7, 0.0, 9, 4, 3)
    r.set_computed(8)
    sched = SimpleNamespace(take_handoffs=lambda: [new.pop() for _ in list(new)],
                            kv=SimpleNamespace(blocks_of=lambda q: (3, 4)),
                            clock=SimpleNamespace(step=0))  # fmt: skip
    replica = SimpleNamespace(scheduler=sched, leave=lambda q: None)
    agent = KVAgent(0, "prefill", replica, None, {}, lambda q: None, sent.append, lambda: 0.0)
    step = lambda n: SimpleNamespace(step=n)  # noqa: E731
    agent.step_over(step(0), 0.010)  # step 0 is over; step 1 was submitted and updated:
    new.append((r, 0.004))
    sched.clock.step = 2
    agent.collect()
    assert not sent and agent.handed == {7: r}  # step 1 still runs
    agent.check_integrity()
    agent.step_over(step(1), 0.021)
    assert sent == [("handoffs", 0, [(7, 8, (3, 4), 0.021)])]  # ready: step 1's end
    # serially a step's end is known before its update: reported at once, at the update's time
    r2 = Request(8, 0.0, 9, 4, 3)
    r2.set_computed(8)
    agent.step_over(step(2), 0.030)
    new.append((r2, 0.030))
    sched.clock.step = 3
    agent.collect()
    assert sent[-1] == ("handoffs", 0, [(8, 8, (3, 4), 0.030)]) and not agent.unready
