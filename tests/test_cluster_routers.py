"""Routers decide from read-only views: each built-in router's rule on replicas in known states,
the views' contract (no attribute can be set, no query changes a replica), stale views."""

from __future__ import annotations

import math

import pytest
from sched_driver import ExactOracle

from horizon.cluster import Cluster, LiveView, PromptHashes, Replica, make_router, router_names
from horizon.plan import StepResult
from horizon.policies import make_policy
from horizon.request import SLO, Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig

PREFIX = tuple(range(100, 164))  # four 16-token blocks


def _req(rid: int, prompt: tuple[int, ...] = (), p: int = 40, out: int = 8, conv: int = -1):
    ids = prompt + tuple(range(5000 + 100 * rid, 5000 + 100 * rid + p - len(prompt)))
    return Request(rid, 0.0, len(ids), 64, out, prompt_token_ids=ids, conversation_id=conv)


def _replica(i: int, blocks: int = 64, predictor=None, clock=None) -> Replica:  # noqa: ANN001
    cfg = SchedulerConfig(
        num_blocks=blocks,
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=4096,
    )
    return Replica(i, Scheduler(cfg, make_policy("fcfs")), predictor=predictor, clock=clock)


def _step(rep: Replica, t: float = 0.0) -> None:
    """One step of ``rep``'s scheduler with nothing finishing (tokens are computed, cached)."""
    plan = rep.scheduler.schedule(t)
    rep.scheduler.update(plan, StepResult(0.01, ()), t + 0.01)
    rep.observe_step(plan, StepResult(0.01, ()), t + 0.01)


def _cluster(n: int, router: str, **opts) -> Cluster:  # noqa: ANN003
    return Cluster([_replica(i) for i in range(n)], make_router(router, **opts))


def _load(c: Cluster, i: int, k: int, start: int = 1000) -> None:
    """Queue ``k`` requests on replica ``i`` directly (not routed)."""
    for j in range(k):
        c.replicas[i].scheduler.add(_req(start + 100 * i + j))


def test_round_robin_cycles_and_random_is_seeded():
    c = _cluster(3, "round_robin")
    assert [c.route(_req(i), 0.0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    picks = [
        [make_router("random", seed=s).route(_req(0), c.views, 0) for _ in range(20)]
        for s in (1, 1, 2)
    ]
    assert picks[0] == picks[1]


def test_least_loaded_and_least_kv_pick_the_emptiest_replica():
    c = _cluster(3, "least_loaded")
    _load(c, 0, 3)
    _load(c, 1, 1)
    _load(c, 2, 2)
    assert c.route(_req(1), 0.0) == 1
    c = _cluster(3, "least_kv")
    _load(c, 0, 1)
    _load(c, 2, 1)
    c.replicas[1].scheduler.add(_req(9, p=200))  # one request, but the most prompt to hold
    assert c.route(_req(1), 0.0) == 0  # least KV demand; routed there once now
    # equal loads: least_loaded sends it to the replica sent fewest, not by KV
    assert make_router("least_loaded").route(_req(2), c.views, 0.0) == 1
    assert c.route(_req(3), 0.0) == 2


def _cache_prefix_on(c: Cluster, i: int) -> None:
    c.replicas[i].scheduler.add(_req(900, PREFIX, p=80))
    _step(c.replicas[i])  # its prompt is computed and its full blocks are cached


def test_prefix_aware_follows_the_cache_until_the_queue_threshold():
    c = _cluster(3, "prefix_aware", threshold=2)
    _cache_prefix_on(c, 2)
    assert c.views[2].prefix_hit_tokens(_req(1, PREFIX, p=80)) == 64
    assert c.views[0].prefix_hit_tokens(_req(1, PREFIX, p=80)) == 0
    assert c.route(_req(1, PREFIX), 0.0) == 2
    assert c.route(_req(2), 0.0) in (0, 1)  # no hit anywhere: least loaded
    _load(c, 2, 3)
    assert c.route(_req(3, PREFIX), 0.0) in (0, 1)  # over the threshold: least loaded


def test_weighted_trades_prefix_against_queue_and_cost_aware_against_decode_load():
    c = _cluster(2, "weighted")
    _cache_prefix_on(c, 1)
    _load(c, 1, 1)
    assert c.route(_req(1, PREFIX), 0.0) == 1  # 3 x 0.8 of the prompt beats 2 x queue
    r = make_router("weighted", prefix_weight=0.0)
    assert r.route(_req(2, PREFIX), c.views, 0.0) == 0
    c = _cluster(2, "cost_aware")
    _cache_prefix_on(c, 1)  # 5 blocks held, 4 of them the prefix
    c.replicas[0].scheduler.add(_req(901, p=32))
    _step(c.replicas[0])  # 2 blocks held, nothing cached that helps
    assert c.route(_req(3, PREFIX, p=80), 0.0) == 1
    heavy = make_router("cost_aware", overlap_weight=0.01)  # decode blocks dominate
    assert heavy.route(_req(4, PREFIX, p=80), c.views, 0.0) == 0


def test_sticky_keeps_a_conversation_home_until_its_replica_is_over_the_threshold():
    c = _cluster(3, "sticky", threshold=1)
    home = c.route(_req(1, conv=7), 0.0)
    assert [c.route(_req(i, conv=7), 0.0) for i in range(2, 5)] == [home] * 3
    _load(c, home, 2)
    moved = c.route(_req(5, conv=7), 0.0)
    assert moved != home and c.route(_req(6, conv=7), 0.0) == moved
    assert c.router.moves == 1


def test_horizon_router_keeps_predicted_kv_demand_under_the_headroom():
    reps = [_replica(i, blocks=40, predictor=ExactOracle()) for i in range(2)]
    c = Cluster(reps, make_router("horizon", predictor=ExactOracle(), ttft_slo=1.0))
    big = Request(1, 0.0, 300, 512, 300, prompt_token_ids=tuple(range(300)))  # 600 of 640 tokens
    assert c.route(big, 0.0) == 0
    c.replicas[0].scheduler.add(big)
    assert math.isclose(c.views[0].predicted_kv_tokens, 600)
    assert c.route(_req(2, p=40, out=40), 0.0) == 1  # replica 0 would pass 90% of its pool
    late = Request(3, 0.0, 40, 64, 8, slo=SLO(1e-9, 1.0), prompt_token_ids=tuple(range(40)))
    assert c.route(late, 0.0) in (0, 1)  # no replica meets the deadline: earliest estimate


def test_views_are_read_only_and_queries_change_nothing():
    c = _cluster(2, "prefix_aware")
    _cache_prefix_on(c, 0)
    _load(c, 1, 2)
    pools = [r.scheduler.pool for r in c.replicas]

    def state():  # noqa: ANN202
        return [(list(p._ref), dict(p._index), list(p._lru), list(p._plain)) for p in pools] + [
            (len(r.scheduler._waiting), len(r.scheduler.running), r.routed) for r in c.replicas
        ]

    before = state()
    names = [n for n in dir(LiveView) if not n.startswith("_")]
    for v in c.views:
        for n in names:
            value = getattr(v, n)
            if callable(value):
                value(_req(1, PREFIX))
            with pytest.raises(AttributeError):
                setattr(v, n, 0)
        with pytest.raises(AttributeError):
            v.extra = 1
    assert state() == before


def test_stale_views_see_reports_and_kv_events_only_after_the_delay():
    now = [0.0]
    reps = [_replica(i, clock=lambda: now[0]) for i in range(2)]
    c = Cluster(reps, make_router("prefix_aware"), view_delay=0.5, now=lambda: now[0])
    reps[0].scheduler.add(_req(900, PREFIX, p=80))
    _step(reps[0], 0.0)  # cached at t = 0.01, reported then
    now[0] = 0.3
    assert c.views[0].num_running == 0 and c.views[0].prefix_hit_tokens(_req(1, PREFIX, p=80)) == 0
    now[0] = 0.52
    assert c.views[0].num_running == 1 and c.views[0].prefix_hit_tokens(_req(1, PREFIX, p=80)) == 64
    assert c.route(_req(2, PREFIX), now[0]) == 0


def test_every_builtin_router_is_registered_and_bad_knobs_name_the_field():
    assert set(router_names()) >= {
        "round_robin",
        "random",
        "least_loaded",
        "least_kv",
        "prefix_aware",
        "weighted",
        "cost_aware",
        "sticky",
        "horizon",
    }
    with pytest.raises(ValueError, match="prefix_aware.threshold"):
        make_router("prefix_aware", threshold=-1)
    with pytest.raises(ValueError, match="unknown router"):
        make_router("nearest")
    hashes = PromptHashes()
    r = _req(1, PREFIX)
    assert hashes.of(r, 16) is hashes.of(r, 16) and hashes.known(_req(2), 16) is None


def test_least_loaded_index_reads_load_key_and_takes_views_without_one():
    from types import SimpleNamespace

    from horizon.cluster import least_loaded_index

    c = _cluster(4, "least_loaded")
    _load(c, 0, 2)
    _load(c, 2, 1)
    _step(c.replicas[2])
    for v in c.views:  # a live view's one-frame key is (load, routed)
        assert v.load_key == (v.load, v.routed) == (v.num_waiting + v.num_running, v.routed)
    assert least_loaded_index(c.views) == 1
    ducks = [SimpleNamespace(load=v.load, routed=v.routed) for v in c.views]
    assert least_loaded_index(ducks) == 1  # no load_key: (load, routed) read
    assert least_loaded_index([]) == 0
