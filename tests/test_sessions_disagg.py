"""Closed-loop sessions on disaggregated (and mixed) simulated clusters with small KV pools: a
turn that can never fit ends rejected with its reason and ends its session, and the run ends
with every session done (it used to hang: the rejection was only reported in the replica's next
plan, which never came on an otherwise idle replica, so the session stayed open forever)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_driver import ConstantCost, policy_for_test

from horizon.cluster import make_router
from horizon.metrics.records import STATUS_FINISHED, STATUS_REJECTED
from horizon.model_shape import model_shape
from horizon.request import Request
from horizon.scheduler import REJECT_KV_POOL
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.sessions import Session
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.kv_link import LinkSpec

SHAPE = model_shape("qwen2.5-0.5b")
POLICIES = ("fcfs", "sjf_prompt", "memory_first", "horizon", "vllm")
LINK = LinkSpec("test", 1e9, 1e-3)


def _session(sid: int, rid: int, prompts: list[int], outputs: list[int], start: float) -> Session:
    history: tuple[int, ...] = ()
    reqs = []
    for k, (p, o) in enumerate(zip(prompts, outputs)):
        history = history + tuple(range(1000 * sid + 50 * k, 1000 * sid + 50 * k + p))
        arrival = start if k == 0 else 0.0
        reqs.append(Request(rid + k, arrival, len(history), 64, o, prompt_token_ids=history))
        history = history + tuple(range(90_000 + 100 * (rid + k), 90_000 + 100 * (rid + k) + o))
    return Session(sid, tuple(reqs), (0.0,) * (len(reqs) - 1), start)


def _cfg(num_blocks: int) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=num_blocks, block_size=1, max_num_seqs=4,
                           max_num_batched_tokens=64, max_model_len=10_000)  # fmt: skip


def _check(sim: ClusterSimulation, rec) -> None:  # noqa: ANN001
    assert sim.release.done  # no session left open
    rec.check()
    sim.cluster.check_integrity()
    merged = rec.merged()
    merged.check()
    assert np.all((merged.status == STATUS_FINISHED) | (merged.status == STATUS_REJECTED))
    assert all(r.scheduler.pool.num_used == 0 for r in sim.cluster.replicas)


def test_a_turn_too_big_for_every_decode_pool_is_rejected_and_ends_its_session():
    # Turn 1's prompt + max_output (74 tokens, then 84) exceeds the decode pool (70 blocks of one
    # token), so it is routed straight to the idle decode replica, which rejects it.
    setups = [
        ReplicaSetup(_cfg(400), policy_for_test("fcfs"), ConstantCost(0.01), SHAPE, role=role)
        if role == "prefill"
        else ReplicaSetup(_cfg(70), policy_for_test("fcfs"), ConstantCost(0.01), SHAPE, role=role)
        for role in ("prefill", "decode")
    ]
    sess = [_session(0, 0, [4, 6, 10], [3, 3, 3], 0.0)]
    sim = ClusterSimulation([], setups, make_router("round_robin"), sessions=sess,
                            decode_router=make_router("least_kv"), kv_link=LINK)  # fmt: skip
    rec = sim.run()
    _check(sim, rec)
    merged = rec.merged()
    assert merged.request_id.tolist() == [0, 1]  # turn 2 never arrives
    assert merged.status.tolist() == [STATUS_FINISHED, STATUS_REJECTED]
    assert merged.reject_reason[1] == REJECT_KV_POOL


def _random_run(seed: int, disagg: bool) -> tuple[ClusterSimulation, object]:
    rng = random.Random(seed)
    roles = ["mixed"] * rng.randint(1, 2)
    if disagg:
        roles = ["prefill"] * rng.randint(1, 2) + ["decode"] * rng.randint(1, 2) + roles[:1]
    bs = rng.choice([1, 2, 4])
    setups = []
    for role in roles:
        seqs = rng.randint(1, 6)
        cfg = SchedulerConfig(
            num_blocks=rng.randint(12, 48),
            block_size=bs,
            max_num_seqs=seqs,
            max_num_batched_tokens=max(2, seqs + rng.randint(0, 40)),
            max_model_len=10_000,
            enable_prefix_caching=rng.random() < 0.8,
        )
        policy = policy_for_test(rng.choice(POLICIES))
        cost = ConstantCost(rng.choice((0.005, 0.01)))
        setups.append(ReplicaSetup(cfg, policy, cost, SHAPE, role=role))
    sessions, rid = [], 0
    for s in range(rng.randint(1, 6)):
        turns = rng.randint(1, 4)
        prompts = [rng.randint(1, 12) for _ in range(turns)]
        outputs = [rng.randint(1, 12) for _ in range(turns)]
        sessions.append(_session(s, rid, prompts, outputs, 0.02 * s))
        rid += turns
    kw = {"decode_router": make_router("least_kv"), "kv_link": LINK} if disagg else {}
    sim = ClusterSimulation([], setups, make_router("least_loaded"), sessions=sessions,
                            check_every=1, pipelined=rng.random() < 0.5,
                            arrivals_at_step_boundaries=rng.random() < 0.5, **kw)  # fmt: skip
    return sim, sim.run()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32), disagg=st.booleans())
def test_random_session_runs_on_small_pools_end_with_every_session_done(seed, disagg):
    _check(*_random_run(seed, disagg))
