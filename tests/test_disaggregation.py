"""Prefill/decode disaggregation on the cluster simulator: a request's KV blocks sit exactly where
the protocol says at every step (prefill replica while pending, both while transferring, decode
replica after), no request is lost, a decode replica is never handed a request it cannot fit,
TTFT's parts add up, the link model prices a transfer and its contention, and runs repeat."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_driver import ConstantCost, policy_for_test, random_requests

from horizon.cluster import make_router
from horizon.cluster.disagg_metrics import TTFT_PARTS, goodput_per_gpu, ttft_breakdown, ttft_parts
from horizon.metrics.latency import ttft
from horizon.metrics.records import STATUS_FINISHED, STATUS_HANDED_OFF, STATUS_REJECTED
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.request import SLO
from horizon.scheduler_config import SchedulerConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.kv_link import LINKS, LinkSpec

SHAPE = model_shape("qwen2.5-0.5b")
POLICIES = ("fcfs", "sjf_prompt", "memory_first", "horizon", "vllm")
DECODE_ROUTERS = ("least_kv", "least_loaded", "round_robin", "random")


def _cfg(rng: random.Random, bs: int) -> SchedulerConfig:
    seqs = rng.randint(1, 8)
    return SchedulerConfig(
        num_blocks=rng.randint(12, 48),
        block_size=bs,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(2, seqs + rng.randint(0, 40)),
        max_model_len=10_000,
        enable_prefix_caching=rng.random() < 0.8,
    )


def _run(seed: int, n_prefill: int, n_decode: int, mixed: int, pipelined: bool, hold: bool,  # noqa: ANN202
         placement: str = "live", device=None):  # noqa: ANN001 - every replica's DeviceSpec  # fmt: skip
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    roles = ["prefill"] * n_prefill + ["decode"] * n_decode + ["mixed"] * mixed
    setups = [
        ReplicaSetup(
            _cfg(rng, bs),
            policy_for_test(rng.choice(POLICIES)),
            ConstantCost(rng.choice((0.005, 0.01, 0.02))),
            SHAPE,
            role=role,
            device=device,
        )
        for role in roles
    ]
    reqs = random_requests(rng, 12 * len(roles) + 10, max_prompt=40, max_output=30, rate=200.0)
    link = LinkSpec("test", rng.choice((1e7, 1e8, 1e9)), rng.choice((0.0, 1e-3)))
    decode_router = make_router(rng.choice(DECODE_ROUTERS))
    sim = ClusterSimulation(
        reqs, setups, make_router("least_loaded"), decode_router=decode_router, kv_link=link,
        check_every=1, pipelined=pipelined, arrivals_at_step_boundaries=hold, placement=placement,
    )  # fmt: skip
    return reqs, sim, sim.run()


def test_random_disaggregated_clusters_keep_every_invariant(scale):
    ops = 0

    @settings(max_examples=190 * scale, deadline=None, derandomize=True)
    @given(
        seed=st.integers(0, 2**32),
        n_prefill=st.integers(1, 4),
        n_decode=st.integers(1, 4),
        mixed=st.integers(0, 1),
        pipelined=st.booleans(),
        hold=st.booleans(),
    )
    def run(seed, n_prefill, n_decode, mixed, pipelined, hold):
        nonlocal ops
        reqs, sim, rec = _run(seed, n_prefill, n_decode, mixed, pipelined, hold)
        ops += check_run(reqs, sim, rec)

    run()
    assert ops >= 100_000 * scale


def check_run(reqs, sim, rec) -> int:  # noqa: ANN001
    """Every invariant of a finished disaggregated run; returns its operations."""
    rec.check()
    sim.cluster.check_integrity()  # the handoffs' block placement, every replica's state
    merged = rec.merged()
    merged.check()
    assert merged.request_id.tolist() == sorted(r.request_id for r in reqs)  # none lost
    done, rej = merged.status == STATUS_FINISHED, merged.status == STATUS_REJECTED
    assert np.all(done | rej)
    handed = sum(int(np.count_nonzero(p.status == STATUS_HANDED_OFF)) for p in rec.replicas)
    assert handed == len(rec.transfers["request_id"])  # every handoff was transferred
    roles = [r.role for r in sim.cluster.replicas]
    assert all(roles[d] == "decode" for d in rec.transfers["dst"].tolist())
    assert all(roles[s] == "prefill" for s in rec.transfers["src"].tolist())
    assert all(r.scheduler.pool.num_used == 0 for r in sim.cluster.replicas)
    return sum(p.num_requests + len(p.step_end) for p in rec.replicas)


def test_the_same_seed_gives_byte_identical_records():
    digests = {_run(11, 2, 2, 1, True, True)[2].digest() for _ in range(2)}
    assert len(digests) == 1
    assert _run(12, 2, 2, 1, True, True)[2].digest() not in digests


def _pd(reqs, link: LinkSpec, decode_blocks: int = 400, cost: float = 0.01):  # noqa: ANN001, ANN202
    big = SchedulerConfig(num_blocks=400, block_size=16, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=8192)  # fmt: skip
    small = SchedulerConfig(num_blocks=decode_blocks, block_size=16, max_num_seqs=16,
                            max_num_batched_tokens=512, max_model_len=8192)  # fmt: skip
    setups = [
        ReplicaSetup(big, make_policy("fcfs"), ConstantCost(cost), SHAPE, role="prefill"),
        ReplicaSetup(small, make_policy("fcfs"), ConstantCost(cost), SHAPE, role="decode"),
    ]
    router, decode = make_router("round_robin"), make_router("least_kv")
    sim = ClusterSimulation(reqs, setups, router, decode_router=decode, kv_link=link, check_every=1)
    return sim, sim.run()


def test_ttft_parts_add_up_and_the_transfer_costs_what_the_link_says():
    reqs = random_requests(random.Random(3), 60, max_prompt=300, max_output=20, rate=20.0)
    link = LinkSpec("slow", 1e9, 2e-3)
    sim, rec = _pd(reqs, link)
    parts = ttft_parts(rec)
    total = sum(parts[k] for k in TTFT_PARTS)
    ok = np.isfinite(total)
    assert ok.sum() == sum(r.num_prompt_tokens >= 2 for r in reqs)
    assert np.allclose(total[ok], ttft(rec.merged())[ok])
    t = rec.transfers
    nbytes = t["num_blocks"] * 16 * SHAPE.kv_bytes_per_token()
    alone = link.latency_s + nbytes / link.bandwidth
    took = t["end"] - t["start"]
    assert np.all(took >= alone - 1e-9)  # never faster than the link alone
    assert np.isclose(np.median(took / alone), 1.0)  # light load: mostly alone on the link
    assert ttft_breakdown(rec)["transfer"] == pytest.approx(float(np.mean(took)))
    assert goodput_per_gpu(rec, slo=SLO(10.0, 10.0)) > 0


def test_a_decode_replica_too_full_holds_the_request_back_on_its_prefill_replica():
    reqs = random_requests(random.Random(5), 200, max_prompt=200, max_output=60, rate=300.0)
    sim, rec = _pd(reqs, LINKS["rdma"], decode_blocks=40)
    t = rec.transfers
    assert np.max(t["start"] - t["ready"]) > 0.05  # backpressure: waited for decode blocks
    merged = rec.merged()
    assert np.all(merged.status == STATUS_FINISHED)
    assert rec.replicas[0].num_kv_blocks == 400 and rec.replicas[1].kv_used_blocks.max() <= 40


def test_overlapping_transfers_share_the_port_they_cross():
    import simpy

    from simulator.kv_link import Fabric

    env = simpy.Environment()
    fabric = Fabric(env, LinkSpec("l", 1e9, 0.0))
    ends = {}

    def go(name, src, dst, nbytes):  # noqa: ANN001, ANN202
        fabric.send(src, dst, nbytes, lambda: ends.__setitem__(name, env.now))

    go("a", 0, 2, 1e9)  # alone for 1 s of bytes
    go("b", 0, 3, 1e9)  # same source: both at half rate
    go("c", 1, 4, 1e9)  # another port: full rate
    env.run()
    assert ends["c"] == pytest.approx(1.0)
    assert ends["a"] == pytest.approx(2.0) and ends["b"] == pytest.approx(2.0)


def test_a_transfer_ending_on_another_events_instant_is_over_after_it():
    """Ties keep the order of a transfer run as SimPy processes: its end is seen two ordinary
    events after its last byte, so after what falls on that instant and what that sets off."""
    import simpy

    from simulator.kv_link import Fabric

    env = simpy.Environment()
    fabric = Fabric(env, LinkSpec("l", 1e9, 0.0))
    order = []
    fabric.send(0, 1, 1e9, lambda: order.append(("done", env.now)))  # its last byte at 1.0

    def other(_ev) -> None:  # noqa: ANN001
        order.append(("other", env.now))
        env.timeout(0).callbacks.append(lambda _e: order.append(("set off", env.now)))

    env.timeout(1.0).callbacks.append(other)
    fabric.send(2, 3, 5e8, lambda: order.append(("alone", env.now)))  # nothing else at 0.5
    env.run()
    assert order == [("alone", 0.5), ("other", 1.0), ("set off", 1.0), ("done", 1.0)]


def test_link_fit_recovers_latency_and_bandwidth():
    nbytes = np.array([1e6, 5e6, 2e7, 8e7])
    link = LinkSpec.fit("same_gpu", nbytes, 30e-6 + nbytes / 2e12)
    assert link.bandwidth == pytest.approx(2e12, rel=1e-6)
    assert link.latency_s == pytest.approx(30e-6, rel=1e-6)


def test_the_measured_same_gpu_link_reads_the_engine_calibration():
    from pathlib import Path

    from simulator.kv_link import measured_link

    path = str(Path(__file__).resolve().parents[1] / "calibration" / "h200_kv_transfer.json")
    link = measured_link(path, "qwen2.5-7b")
    assert 50e9 < link.bandwidth < 4.8e12  # a device copy: above PCIe, below HBM's peak
    assert 0 < link.latency_s < 1e-3
    with pytest.raises(ValueError, match="qwen9"):
        measured_link(path, "qwen9")


def test_roles_without_their_counterparts_raise_errors_that_name_the_field():
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_num_seqs=4,
                          max_num_batched_tokens=64, max_model_len=1024)  # fmt: skip

    def setups(*roles, shape=SHAPE):  # noqa: ANN002, ANN202
        return [
            ReplicaSetup(cfg, make_policy("fcfs"), ConstantCost(), shape, role=r) for r in roles
        ]

    rr = make_router("round_robin")
    with pytest.raises(ValueError, match="decode_router"):
        ClusterSimulation([], setups("prefill", "decode"), rr, kv_link=LINKS["nvlink"])
    with pytest.raises(ValueError, match="kv_link"):
        ClusterSimulation(
            [], setups("prefill", "decode"), rr, decode_router=make_router("least_kv")
        )
    with pytest.raises(ValueError, match="decode replica"):
        ClusterSimulation(
            [], setups("prefill", "mixed"), rr, decode_router=rr, kv_link=LINKS["nvlink"]
        )
    with pytest.raises(ValueError, match="prefill replicas"):
        ClusterSimulation([], setups("decode", "mixed"), rr)
    with pytest.raises(ValueError, match="ReplicaSetup.shape"):
        no_shape = setups("prefill", "decode", shape=None)
        ClusterSimulation([], no_shape, rr, decode_router=rr, kv_link=LINKS["nvlink"])
    with pytest.raises(ValueError, match="Replica.role"):
        ClusterSimulation([], setups("prefil"), rr)
    with pytest.raises(ValueError, match="LinkSpec.bandwidth"):
        LinkSpec("x", 0.0, 0.0)
