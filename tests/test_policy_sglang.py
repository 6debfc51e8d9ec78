"""The sglang baseline: SGLang's new-token-ratio reserve, retraction rule and FCFS/LPM order."""

from __future__ import annotations

import math

import pytest
from sched_driver import ConstantCost

from horizon.block_pool import BlockPool
from horizon.kv_cache import KVCacheManager, KVView, ReservationLedger
from horizon.metrics import summarize
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.policies.sglang import SGLangPolicy
from horizon.request import SLO, Request, RequestStatus, StepClock
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import WorkloadConfig, build_workload
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.backend import SimBackend


def _decoding(rid: int, prompt: int, outputs: int, cap: int = 2048, seq: int = 0) -> Request:
    """A request that has emitted ``outputs`` tokens and decodes its next one."""
    r = Request(rid, 0.0, prompt, cap, cap)
    r.advance(prompt)
    for _ in range(outputs - 1):
        r.advance(1)
    r.admit_seq = seq
    assert r.is_decode and r.num_output_tokens == outputs
    return r


class _Step:
    """What refresh reads: the step and the running requests."""

    def __init__(self, step: int, running: tuple[Request, ...]) -> None:
        self.step, self.running = step, running


def test_ratio_decays_per_decoding_step_to_its_floor():
    p = SGLangPolicy(decay_steps=4)
    assert (p.ratio, p.min_ratio) == (0.7, pytest.approx(0.7 * 0.14))
    decoding, prefilling = (_decoding(0, 8, 1),), (Request(1, 0.0, 8, 16, 16),)
    p.refresh(_Step(0, prefilling), 0.0)  # a step without a decode: no decay
    assert p.ratio == 0.7
    seen = []
    for step in range(1, 7):
        p.refresh(_Step(step, decoding), 0.0)
        seen.append(p.ratio)
    step = (0.7 - 0.098) / 4
    assert seen[:3] == pytest.approx([0.7 - step, 0.7 - 2 * step, 0.7 - 3 * step])
    assert seen[3:] == pytest.approx([0.098] * 3)  # floored, stays there


def test_conservativeness_scales_the_schedule_and_caps_it_at_one():
    half = SGLangPolicy(conservativeness=0.5)
    assert (half.init_ratio, half.min_ratio) == pytest.approx((0.35, 0.049))
    assert half.decay == pytest.approx((0.35 - 0.049) / 600)
    double = SGLangPolicy(conservativeness=2.0)
    assert (double.init_ratio, double.min_ratio) == pytest.approx((1.0, 0.14))


def test_reserve_is_the_ratio_share_of_the_clipped_remaining_output():
    p = SGLangPolicy(conservativeness=0.5, clip_max_new_tokens=1000)
    long_cap = _decoding(0, 100, 10, cap=5000)  # 4,990 to go, clipped to 1,000
    assert p.reserve_tokens(long_cap) == 110 + math.ceil(0.35 * 1000)
    short_cap = _decoding(1, 100, 10, cap=300)  # 290 to go, under the clip
    assert p.reserve_tokens(short_cap) == 110 + math.ceil(0.35 * 290)
    done = _decoding(2, 100, 300, cap=300)
    assert p.reserve_tokens(done) == 400
    p.ratio = 0.1
    assert p.reserve_tokens(long_cap) == 110 + 100


def _one_running(candidate: Request) -> Scheduler:
    """Step 0 admits A (32-token prompt, cap 160) into 20 blocks of 16; step 1 plans with
    ``candidate`` waiting. After A's reserve, 10 blocks are left to admit with."""
    sched = Scheduler(SchedulerConfig(num_blocks=20, block_size=16), SGLangPolicy())
    backend = SimBackend(ConstantCost())
    sched.add(Request(0, 0.0, 32, 160, 160))
    plan = sched.schedule(0.0)
    # admitted in this step: its whole share, ceil((32 + 160) / 16) = 12 blocks, 2 held
    assert sched.view.num_reserved_blocks == 10
    sched.update(plan, backend.execute(plan), 0.01)
    sched.add(candidate)
    sched.schedule(0.01)
    return sched


def test_admission_refuses_a_request_whose_share_does_not_fit_and_admits_one_that_does():
    too_big = Request(1, 0.005, 16, 160, 10)  # 16 + 160 tokens: 11 blocks > 10
    sched = _one_running(too_big)
    assert too_big.status is RequestStatus.WAITING
    # A: 33 tokens + ceil(0.699 * 159) = 145 tokens, 10 blocks, 3 held. 17 free: the pool has
    # room for the 11 blocks; A's reserve leaves 10
    assert (sched.view.num_free_blocks, sched.view.num_reserved_blocks) == (17, 7)
    fits = Request(1, 0.005, 16, 144, 10)  # 16 + 144 tokens: 10 blocks
    sched = _one_running(fits)
    assert fits.status is RequestStatus.RUNNING
    # in its admission step it holds its whole share: 10 blocks, 1 held
    assert (sched.view.num_free_blocks, sched.view.num_reserved_blocks) == (16, 7 + 9)


def test_a_retraction_takes_the_fewest_outputs_then_the_longest_prompt_and_reestimates():
    p = SGLangPolicy()
    p.ratio = p.min_ratio
    old = _decoding(0, 50, 900, cap=1000, seq=0)
    short = _decoding(1, 50, 3, cap=1000, seq=1)
    long_prompt = _decoding(2, 400, 3, cap=1000, seq=2)
    assert p.choose_victim((old, short, long_prompt), old, 0.0) is long_prompt
    # survivors: 903 decoded + 20 steps each, over 2,000 tokens of caps (+1)
    assert p.ratio == pytest.approx((903 + 40) / 2001)  # up from the floor
    twin = _decoding(3, 400, 3, cap=1000, seq=3)  # same counts, admitted later: goes first
    assert p.choose_victim((old, long_prompt, twin), old, 0.0) is twin
    fresh = _decoding(4, 50, 1, cap=1000, seq=4)
    p.choose_victim((old, fresh), old, 0.0)
    assert p.ratio == pytest.approx((900 + 20) / 1001)
    p.choose_victim((fresh,), fresh, 0.0)  # no survivor left
    assert p.ratio == 0.0 and p.num_retractions == 4
    p.check_integrity()


def test_the_step_that_retracts_admits_nothing():
    # a ratio near 0 admits more than the pool can grow: 8 blocks, requests of 16 + 48 tokens
    p = SGLangPolicy(init_ratio=0.01)
    sched = Scheduler(SchedulerConfig(num_blocks=8, block_size=16), p)
    backend = SimBackend(ConstantCost())
    reqs = [Request(i, 0.0, 16, 48, 48) for i in range(4)]
    for r in reqs:
        sched.add(r)
    now, retracting = 0.0, 0
    while sched.has_work:
        waiting = {r.request_id for r in reqs if r.status is RequestStatus.WAITING}
        plan = sched.schedule(now)
        admitted = {r.request_id for r, _ in plan.prefills} & waiting
        if plan.preempted:
            assert not admitted
            victim = plan.preempted[0]
            assert min(r.num_output_tokens for r in plan.decodes) >= victim.num_output_tokens
            if not retracting:  # the pool has room for a 1-token request: the rule refuses it
                tiny, view = Request(9, now, 1, 1, 1), sched.view
                assert view.blocks_to_admit(tiny, 2) <= view.num_free_blocks
                assert view.num_reserved_blocks == 0 and not p.admit(tiny, view)
            retracting += 1
        now += 0.01
        sched.update(plan, backend.execute(plan), now)
        sched.check_integrity()
        assert now < 10.0
    assert retracting >= 1 and p.num_retractions == retracting
    assert all(r.status is RequestStatus.FINISHED for r in reqs)


def test_fcfs_order_is_queue_entry_so_a_retracted_request_goes_to_the_back():
    p = SGLangPolicy()
    first, second = Request(1, 1.0, 8, 8, 8), Request(2, 2.0, 8, 8, 8)
    retracted = Request(0, 0.0, 8, 8, 8)
    keys = {
        r.request_id: p.waiting_key(r, now)
        for r, now in ((first, 1.0), (second, 2.0), (retracted, 3.0))
    }
    assert keys[1] < keys[2] < keys[0]
    assert not p.dynamic_order


def _pool_with_cached_prompt(prompt: tuple[int, ...], caching: bool = True) -> KVView:
    """A pool of 32 blocks of 16 where a finished request left ``prompt``'s blocks cached."""
    kv = KVCacheManager(BlockPool(32, 16), enable_prefix_caching=caching)
    done = Request(100, 0.0, len(prompt), 4, 4, prompt_token_ids=prompt)
    assert kv.allocate(done, -(-len(prompt) // 16))
    done.advance(len(prompt))
    kv.register_computed(done)
    kv.free(done)
    return KVView(kv, ReservationLedger(), {}, StepClock())


def test_cached_prefix_tokens_reads_the_pool_without_changing_it():
    base = tuple(range(64))
    view = _pool_with_cached_prompt(base)
    pool = view._kv.pool
    before = (pool.num_free, pool.num_cached)
    shares_48 = Request(0, 0.0, 64, 8, 8, prompt_token_ids=base[:48] + (999,) * 16)
    same = Request(1, 0.0, 64, 8, 8, prompt_token_ids=base)  # never its last token: 3 blocks
    other = Request(2, 0.0, 64, 8, 8, prompt_token_ids=(7,) * 64)
    unknown = Request(3, 0.0, 64, 8, 8)  # no token ids
    assert [view.cached_prefix_tokens(r) for r in (shares_48, same, other, unknown)] == [
        48,
        48,
        0,
        0,
    ]
    assert (pool.num_free, pool.num_cached) == before and view.prefix_caching
    view._kv.check_integrity()
    off = _pool_with_cached_prompt(base, caching=False)
    assert not off.prefix_caching and off.cached_prefix_tokens(same) == 0


def _waiting(p: SGLangPolicy, ids: list[tuple[int, ...]]) -> list[Request]:
    reqs = [Request(i, 0.1 * i, len(t), 8, 8, prompt_token_ids=t) for i, t in enumerate(ids)]
    for r in reqs:
        p.waiting_key(r, r.arrival_time)
    return reqs


def _order(keys: list, reqs: list[Request]) -> list[int]:
    return [r.request_id for _, r in sorted(zip(keys, reqs), key=lambda kr: kr[0])]


def test_lpm_orders_by_longest_cached_prefix_and_sends_a_repeated_head_last():
    base = tuple(range(64))
    view = _pool_with_cached_prompt(base)
    p = SGLangPolicy(lpm=True)
    assert p.dynamic_order
    head = tuple(range(500, 532))  # 32 uncached tokens that two requests start with
    reqs = _waiting(
        p,
        [
            head + (2,) * 8,  # 0: nothing cached, first with this head
            head + (4,) * 8,  # 1: repeats 0's head: warms nothing, goes last
            (1,) * 40,  # 2: nothing cached
            base[:32] + (3,) * 20,  # 3: 32 cached tokens
            base[:48] + (5,) * 20,  # 4: 48 cached tokens
        ],
    )
    assert _order(p.rank_waiting(reqs, view, 1.0), reqs) == [4, 3, 0, 2, 1]
    # without prefix caching, or past 128 waiting requests: FCFS
    assert _order(p.rank_waiting(reqs, _pool_with_cached_prompt(base, False), 1.0), reqs) == [
        0,
        1,
        2,
        3,
        4,
    ]
    many = _waiting(p, [(1,) * 40] * 125 + [base[:48] + (5,) * 20] * 4)
    keys = p.rank_waiting(many, view, 1.0)
    assert _order(keys, many) == list(range(129))


def test_check_integrity_catches_a_ratio_out_of_range():
    p = SGLangPolicy()
    p.check_integrity()
    p.ratio = 1.5
    with pytest.raises(AssertionError, match="outside"):
        p.check_integrity()


def test_bad_knobs_are_named():
    for kwargs, field in [
        (dict(conservativeness=0.0), "conservativeness"),
        (dict(init_ratio=math.inf), "init_ratio"),
        (dict(min_ratio_factor=1.5), "min_ratio_factor"),
        (dict(decay_steps=0), "decay_steps"),
        (dict(clip_max_new_tokens=2.5), "clip_max_new_tokens"),
        (dict(retract_decode_steps=-1), "retract_decode_steps"),
        (dict(lpm="yes"), "lpm"),
    ]:
        with pytest.raises(ValueError, match=f"sglang.{field}"):
            SGLangPolicy(**kwargs)


def test_end_to_end_every_request_finishes_with_fewer_preemptions_than_fcfs(sharegpt_head):
    """Under KV pressure (500 blocks, 60 req/s) fcfs preempts; SGLang's reserve, with every
    request's share of a 2,048-token cap to fit at admission, preempts less (here: never), and
    pays for it in queueing."""
    wl = build_workload(WorkloadConfig(num_requests=400, rate=60.0, seed=0), sharegpt_head)
    cost = make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))
    runs = {}
    for policy in (make_policy("fcfs"), SGLangPolicy()):
        sim = Simulation(
            wl.new_requests(), SchedulerConfig(num_blocks=500), policy, cost, check_every=25
        )
        rec = sim.run()
        runs[policy.name] = (rec, summarize(rec, SLO(1.0, 0.05)))
    (fcfs, s_fcfs), (sgl, s_sgl) = runs["fcfs"], runs["sglang"]
    assert (sgl.status == 0).all() and len(sgl.status) == 400
    assert fcfs.num_preemptions.sum() > 50
    assert sgl.num_preemptions.sum() < fcfs.num_preemptions.sum()
    assert s_sgl["queue_wait_mean"] > s_fcfs["queue_wait_mean"]
