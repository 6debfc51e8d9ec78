"""Handoffs placed as the engine's driver places them (``placement="reported"``): decided on a
decode replica's latest step-end free blocks less the imports sent since, taken or refused by
the replica at a later step boundary; every invariant of disaggregated serving still holds,
with the KV over the link or copied inline (``tests/test_inline_copies.py``)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_driver import ConstantCost, random_requests
from test_disaggregation import SHAPE, _run, check_run

from experiments.pd_fidelity import placement_lag
from horizon.cluster import make_router
from horizon.cluster.reported_imports import ReportedImports
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.device_sharing import DeviceSpec
from simulator.kv_link import LINKS
from simulator.reported_placement import MESSAGE_S, Placement


def test_random_clusters_placed_on_reports_keep_every_invariant(scale):
    ops, refusals = 0, 0

    @settings(max_examples=80 * scale, deadline=None, derandomize=True)
    @given(
        seed=st.integers(0, 2**32),
        n_prefill=st.integers(1, 3),
        n_decode=st.integers(1, 3),
        pipelined=st.booleans(),
        hold=st.booleans(),
        inline=st.booleans(),
        quantum=st.booleans(),
    )
    def run(seed, n_prefill, n_decode, pipelined, hold, inline, quantum):
        nonlocal ops, refusals
        placement = Placement("reported", copy="inline" if inline else "link")
        turns = quantum and pipelined  # every replica on one GPU of simulated turns
        gpu = DeviceSpec("gpu0", "quantum", quantum_s=1e-3) if turns else None
        reqs, sim, rec = _run(seed, n_prefill, n_decode, 0, pipelined, hold, placement, gpu)
        ops += check_run(reqs, sim, rec)
        t = rec.transfers
        assert np.all(t["start"] >= t["ready"] + MESSAGE_S - 1e-12)  # the import came later
        refusals += sim.transfers.reported.refusals
        for d in np.unique(t["dst"]) if inline else ():  # a replica's copies never overlap
            mine = t["dst"] == d
            order = np.argsort(t["start"][mine], kind="stable")
            assert np.all(t["start"][mine][order][1:] >= t["end"][mine][order][:-1] - 1e-12)

    run()
    assert ops >= 20_000 * scale
    assert refusals > 0  # the refusal path ran


def test_the_same_seed_gives_byte_identical_records():
    digests = {_run(11, 2, 2, 0, True, True, "reported")[2].digest() for _ in range(2)}
    assert len(digests) == 1
    assert _run(11, 2, 2, 0, True, True)[2].digest() not in digests  # live placement differs


def _tight(placement: str | Placement):  # noqa: ANN202
    reqs = random_requests(random.Random(5), 200, max_prompt=200, max_output=60, rate=300.0)
    big = SchedulerConfig(num_blocks=400, block_size=16, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=8192)  # fmt: skip
    small = SchedulerConfig(num_blocks=40, block_size=16, max_num_seqs=16,
                            max_num_batched_tokens=512, max_model_len=8192)  # fmt: skip
    setups = [
        ReplicaSetup(big, make_policy("fcfs"), ConstantCost(0.01), SHAPE, role="prefill"),
        ReplicaSetup(small, make_policy("fcfs"), ConstantCost(0.01), SHAPE, role="decode"),
    ]
    sim = ClusterSimulation(reqs, setups, make_router("round_robin"), check_every=1,
                            decode_router=make_router("least_kv"), kv_link=LINKS["rdma"],
                            pipelined=True, arrivals_at_step_boundaries=True,
                            placement=placement)  # fmt: skip
    return reqs, sim, sim.run()


def test_a_full_decode_replica_refuses_and_is_offered_nothing_until_its_next_step():
    """40 decode blocks for 200 requests: imports placed on a step end's free blocks find
    them taken by the replica's own plan at the boundary they reach it, and are refused; a
    refused request is placed again only after that replica's next step ends."""
    reqs, sim, rec = _tight("reported")
    check_run(reqs, sim, rec)
    placement = sim.transfers.reported
    assert placement.refusals > 0
    assert rec.replicas[1].kv_used_blocks.max() <= 40
    _, _, live = _tight("live")
    wait = rec.transfers["start"] - rec.transfers["ready"]
    live_wait = live.transfers["start"] - live.transfers["ready"]
    assert wait.mean() > live_wait.mean()  # placing on reports waits longer for blocks
    lag, live_lag = placement_lag(rec), placement_lag(live)
    assert lag["refusals"] == placement.refusals and live_lag["refusals"] == 0
    assert lag["steps_between"] > 0.5 > 0.2 > live_lag["steps_between"]  # a plan came first
    assert np.all(rec.transfers["placed"] <= rec.transfers["start"])
    pre, dec = rec.replicas
    assert dec.num_preempted.sum() > 0 and pre.num_preempted.sum() == 0
    assert pre.num_preemptions.sum() == 0  # a handed-off row counts its own replica's only
    assert dec.num_preemptions.sum() == dec.num_preempted.sum()


def test_an_import_placed_on_a_drained_report_is_taken_at_the_next_boundary():
    """A preempting plan drains the engine's pipeline, so its step's report precedes the
    plan's host work: with that work (``drain_s``) longer than the message, imports placed on
    such reports are there at the next boundary, before another plan takes the blocks."""
    _, sim, rec = _tight("reported")
    _, fast_sim, fast = _tight(Placement("reported", drain_s=1e-3))
    assert rec.replicas[1].num_preempted.sum() > 0  # there are drained reports
    assert fast_sim.transfers.reported.refusals < sim.transfers.reported.refusals
    wait = fast.transfers["start"] - fast.transfers["ready"]
    assert (wait >= 0).all()


def test_the_estimate_counts_unanswered_imports_and_blocks_after_a_refusal():
    free = [10]
    imp = ReportedImports(20, 4, 64, free_blocks=lambda: free[0])
    a, b, c = (Request(i, 0.0, 17, 8, 4) for i in range(3))
    for r in (a, b, c):
        r.set_computed(16)  # 16 tokens moved, the 17th computed there: 5 blocks
    assert imp.import_blocks(a) == 5 and imp.can_import(a)
    imp.reserve_import(a)
    assert imp.can_import(b)  # 10 - 5 free by the estimate
    imp.reserve_import(b)
    assert not imp.can_import(c)  # 0 left until an answer or a report
    imp.answered(a, True)
    free[0] = 5  # the replica's next report: a's blocks are taken
    imp.reported()
    assert not imp.can_import(c)  # b still unanswered
    imp.answered(b, False)
    assert imp.blocked and not imp.can_import(c) and not imp.kv.blocks_of(b)
    imp.reported()
    assert imp.can_import(c)
    imp.check_integrity()
    huge = Request(9, 0.0, 200, 8, 4)
    assert imp.never_fits(huge) and not imp.can_import(huge)


def test_bad_placement_settings_raise_errors_that_name_the_field():
    reqs = random_requests(random.Random(1), 4, max_prompt=20, max_output=5, rate=10.0)
    with pytest.raises(ValueError, match="ClusterSimulation.placement"):
        ClusterSimulation(reqs, _pd_setups(), make_router("round_robin"),
                          decode_router=make_router("least_kv"), kv_link=LINKS["nvlink"],
                          placement="instant")  # fmt: skip
    with pytest.raises(ValueError, match="Placement.message_s"):
        Placement("reported", message_s=-1.0)
    with pytest.raises(ValueError, match="Placement.drain_s"):
        Placement("reported", drain_s=float("nan"))


def _pd_setups() -> list[ReplicaSetup]:
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_num_seqs=4,
                          max_num_batched_tokens=64, max_model_len=1024)  # fmt: skip
    return [ReplicaSetup(cfg, make_policy("fcfs"), ConstantCost(0.01), SHAPE, role=role)
            for role in ("prefill", "decode")]  # fmt: skip


def test_an_autoscaled_cluster_placed_on_reports_loses_nothing():
    """Decode replicas start and drain while imports are offered to them on reports."""
    from test_autoscaling_disagg import CFG, _requests

    from horizon.cluster import make_autoscaler
    from horizon.metrics.records import STATUS_FINISHED
    from horizon.workload.builder import fresh_copy
    from simulator.autoscaling import AutoscaleConfig

    reqs = _requests(3)
    scalers = {"prefill": make_autoscaler("predictive", per_replica_capacity=8.0),
               "decode": make_autoscaler("reactive")}  # fmt: skip
    cfg = {r: AutoscaleConfig(interval_s=5, startup_delay_s=d, initial=1)
           for r, d in {"prefill": 12.0, "decode": 7.0}.items()}  # fmt: skip
    setups = [ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(0.02), SHAPE, role=role)
              for role in ("prefill", "decode") for _ in range(3)]  # fmt: skip
    sim = ClusterSimulation([fresh_copy(r) for r in reqs], setups, make_router("least_loaded"),
                            decode_router=make_router("least_kv"), kv_link=LINKS["nvlink"],
                            autoscaler=scalers, autoscale=cfg, check_every=1,
                            placement="reported")  # fmt: skip
    rec = sim.run()
    rec.check()
    merged = rec.merged()
    assert merged.num_requests == len(reqs) and np.all(merged.status == STATUS_FINISHED)
    assert sim.transfers.reported.refusals > 0
    assert len(set(rec.transfers["dst"].tolist())) > 1  # a started decode replica took some
