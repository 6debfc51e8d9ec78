"""The cluster simulator: one replica is the single-replica simulator exactly; closed-loop
sessions wait for the previous reply; cache-aware routing finds the shared prefixes; the merged
records and the cluster metrics add up."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sched_driver import ConstantCost, random_requests

from horizon.cluster import make_router, merge_records
from horizon.cluster.metrics import cluster_summary, imbalance, prefix_hit_rate
from horizon.metrics.records import STATUS_FINISHED
from horizon.policies import make_policy
from horizon.request import SLO, Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import SharedPrefixConfig, build_shared_prefix
from horizon.workload.builder import fresh_copy
from simulator import Simulation
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup

CFG = SchedulerConfig(
    num_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
)


def _setups(n: int, cost: float = 0.01, policy: str = "fcfs") -> list[ReplicaSetup]:
    return [ReplicaSetup(CFG, make_policy(policy), ConstantCost(cost)) for _ in range(n)]


@pytest.mark.parametrize("pipelined,hold", [(False, False), (True, True), (True, False)])
def test_one_replica_cluster_is_the_single_replica_simulator(pipelined, hold):
    reqs = random_requests(random.Random(3), 120, max_prompt=200, max_output=60, rate=40.0)
    single = Simulation(
        [fresh_copy(r) for r in reqs],
        CFG,
        make_policy("fcfs"),
        ConstantCost(),
        pipelined=pipelined,
        arrivals_at_step_boundaries=hold,
    ).run()
    cluster = ClusterSimulation(
        [fresh_copy(r) for r in reqs],
        _setups(1),
        make_router("random"),
        pipelined=pipelined,
        arrivals_at_step_boundaries=hold,
    ).run()
    assert cluster.replicas[0].digest() == single.digest()
    assert merge_records(cluster.replicas).digest() == single.digest()


def test_merged_records_hold_every_request_once_in_id_order():
    reqs = random_requests(random.Random(4), 200, max_prompt=100, max_output=40, rate=200.0)
    rec = ClusterSimulation(reqs, _setups(3), make_router("round_robin")).run()
    merged = rec.merged()
    merged.check()
    assert merged.request_id.tolist() == list(range(200))
    assert np.bincount(rec.assignment).tolist() == [67, 67, 66]
    for part in rec.replicas:
        for row, rid in enumerate(part.request_id.tolist()):
            assert np.array_equal(part.tokens_of(row), merged.tokens_of(rid))
    assert merged.num_kv_blocks == 3 * CFG.num_blocks


def _sessions(n: int, turns: int, think: float):  # noqa: ANN202
    from horizon.workload.sessions import Session

    out, rid = [], 0
    for s in range(n):
        history: tuple[int, ...] = ()
        reqs = []
        for k in range(turns):
            history = history + tuple(range(1000 * s + 40 * k, 1000 * s + 40 * k + 40))
            reqs.append(
                Request(
                    rid,
                    0.1 * s if k == 0 else 0.0,
                    len(history),
                    64,
                    10,
                    prompt_token_ids=history,
                    conversation_id=s,
                    turn_index=k,
                )
            )
            rid += 1
            history = history + tuple(range(90_000 + rid * 10, 90_000 + rid * 10 + 10))
        out.append(Session(s, tuple(reqs), (think,) * (turns - 1), 0.1 * s))
    return out


def assert_turns_follow_replies(rec, sessions, think: float) -> None:  # noqa: ANN001
    """Every request finished, and each later turn arrived ``think`` after its previous
    turn's last token."""
    rec.check()
    merged = rec.merged()
    n = sum(len(s.requests) for s in sessions)
    assert np.all(merged.status == STATUS_FINISHED) and merged.num_requests == n
    last = {rid: merged.tokens_of(rid)[-1] for rid in range(n)}
    for s in sessions:
        for a, b in zip(s.requests, s.requests[1:]):
            assert merged.arrival_time[b.request_id] == pytest.approx(last[a.request_id] + think)


def test_closed_loop_sessions_wait_for_the_previous_reply_and_think():
    sessions = _sessions(6, 4, think=0.5)
    rec = ClusterSimulation(
        [],
        _setups(2),
        make_router("sticky"),
        sessions=sessions,
        pipelined=True,
        arrivals_at_step_boundaries=True,
    ).run()
    assert_turns_follow_replies(rec, sessions, 0.5)
    for s in sessions:
        homes = {int(rec.assignment[r.request_id]) for r in s.requests}
        assert len(homes) == 1  # sticky: the conversation stays where its cache is
    assert prefix_hit_rate(rec) > 0.4  # later turns reuse their history's blocks


def test_prefix_aware_routing_finds_the_shared_prompts_round_robin_does_not():
    cfg = SharedPrefixConfig(
        num_requests=300,
        num_groups=16,
        prefix_tokens=512,
        question_tokens=32,
        output_tokens=16,
        rate=50.0,
        seed=1,
    )
    reqs = build_shared_prefix(cfg, None)
    rates = {}
    for name in ("round_robin", "prefix_aware"):
        rec = ClusterSimulation(
            [fresh_copy(r) for r in reqs],
            _setups(4),
            make_router(name),
            pipelined=True,
            arrivals_at_step_boundaries=True,
        ).run()
        rates[name] = prefix_hit_rate(rec)
        summary = cluster_summary(rec, SLO(1.0, 0.1))
        assert summary["requests"] == 300 and len(summary["per_replica"]) == 4
    assert rates["prefix_aware"] > rates["round_robin"] + 0.1


def test_heterogeneous_replicas_and_least_loaded_balance_the_slow_one():
    reqs = random_requests(random.Random(5), 300, max_prompt=100, max_output=60, rate=300.0)
    setups = [ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(c)) for c in (0.005, 0.05)]
    rec = ClusterSimulation(reqs, setups, make_router("least_loaded")).run()
    counts = np.bincount(rec.assignment)
    assert counts[0] > 1.5 * counts[1]  # the fast replica drains faster and is sent more
    assert imbalance(rec)["max_over_mean"] > 1.2


def test_bad_setups_raise_errors_that_name_the_field():
    shared = make_policy("fcfs")
    with pytest.raises(ValueError, match="ReplicaSetup.policy"):
        ClusterSimulation(
            [], [ReplicaSetup(CFG, shared, ConstantCost())] * 2, make_router("round_robin")
        )
    with pytest.raises(ValueError, match="view_delay"):
        ClusterSimulation([], _setups(2), make_router("round_robin"), view_delay=-1.0)
