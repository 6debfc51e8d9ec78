"""Scheduler.abort: a waiting request leaves the queue, a running one is finished at a step
boundary with its blocks freed; idempotent, recorded, and check_integrity() holds after it."""

from __future__ import annotations

import random

import pytest
from sched_driver import policy_for_test, random_requests

from horizon.metrics.records import STATUS_FINISHED, STATUS_UNFINISHED
from horizon.plan import StepPlan, StepResult
from horizon.policies import make_policy, policy_names
from horizon.request import Request, RequestStatus
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig

MODES = ("event", "reference")


def scheduler(mode: str = "event", num_blocks: int = 64, policy: str = "fcfs", **kw) -> Scheduler:
    cfg = SchedulerConfig(
        num_blocks=num_blocks,
        block_size=kw.pop("block_size", 4),
        max_num_batched_tokens=kw.pop("budget", 64),
        max_num_seqs=kw.pop("max_seqs", 8),
        max_model_len=1000,
        step_mode=mode,
        **kw,
    )
    return Scheduler(cfg, make_policy(policy) if policy == "fcfs" else policy_for_test(policy))


def req(i: int, prompt: int = 8, out: int = 10, t: float = 0.0) -> Request:
    return Request(i, t, prompt, out, out, prompt_token_ids=tuple(range(i, i + prompt)))


def finished(plan: StepPlan) -> tuple[Request, ...]:
    """The trace stopping rule, read from the counters (exact in both modes)."""
    emit = list(plan.decodes) + [
        r for r, n in plan.prefills if r.num_computed_tokens + n == r.num_tokens
    ]
    return tuple(r for r in emit if r.num_output_tokens + 1 == r.true_output_tokens)


def step(sched: Scheduler, now: float = 0.0) -> StepPlan:
    plan = sched.schedule(now)
    sched.update(plan, StepResult(0.01, finished(plan)), now + 0.01)
    sched.check_integrity()
    return plan


@pytest.mark.parametrize("mode", MODES)
def test_abort_waiting_request_leaves_the_queue(mode):
    sched = scheduler(mode, max_seqs=1)
    for i in range(3):
        sched.add(req(i))
    step(sched)  # request 0 runs, 1 and 2 wait
    assert sched.num_waiting == 2
    assert sched.abort(1)
    sched.check_integrity()
    assert sched.num_waiting == 1 and sched.num_aborted == 1
    (r,) = sched.take_aborted()
    assert r.request_id == 1 and r.status is RequestStatus.FINISHED
    assert not sched.abort(1) and sched.take_aborted() == []  # idempotent
    while sched.has_work:
        step(sched)
    rec = sched.recorder.build()
    rec.check()
    assert list(rec.status) == [STATUS_FINISHED, STATUS_UNFINISHED, STATUS_FINISHED]
    assert rec.num_output_tokens[1] == 0


@pytest.mark.parametrize("mode", MODES)
def test_abort_running_decode_frees_its_blocks_at_a_boundary(mode):
    sched = scheduler(mode)
    sched.add(req(0, prompt=8, out=50))
    sched.add(req(1, prompt=8, out=5))
    for _ in range(6):
        step(sched)
    r0 = sched.running[0]
    emitted = r0.num_output_tokens
    assert emitted == 6 and sched.pool.num_used > 0
    assert sched.abort(0)  # no plan pending: at once
    sched.check_integrity()
    assert 0 not in sched.running and sched.pool.num_used == 0  # request 1 finished already
    assert [r.request_id for r in sched.take_aborted()] == [0]
    assert not sched.abort(0)
    assert not sched.has_work
    rec = sched.recorder.build()
    rec.check()
    assert rec.status[0] == STATUS_UNFINISHED and rec.num_output_tokens[0] == emitted
    assert rec.status[1] == STATUS_FINISHED


@pytest.mark.parametrize("mode", MODES)
def test_abort_with_a_plan_pending_waits_for_its_update(mode):
    sched = scheduler(mode)
    sched.add(req(0, prompt=8, out=50))
    for _ in range(3):
        step(sched)
    plan = sched.schedule(0.1)
    assert sched.abort(0)
    assert 0 in sched.running and sched.take_aborted() == []  # the step is in flight
    assert not sched.abort(0)  # already to be aborted
    sched.update(plan, StepResult(0.01, finished(plan)), 0.11)
    sched.check_integrity()
    assert not sched.running and sched.pool.num_used == 0
    assert [r.request_id for r in sched.take_aborted()] == [0]
    rec = sched.recorder.build()
    rec.check()
    assert rec.num_output_tokens[0] == 4  # the pending step's token counts


def test_abort_of_a_request_finishing_in_the_pending_step_is_a_finish():
    sched = scheduler()
    sched.add(req(0, prompt=4, out=3))
    step(sched)
    step(sched)
    plan = sched.schedule(0.0)  # emits its last token
    assert sched.abort(0)
    sched.update(plan, StepResult(0.01, finished(plan)), 0.01)
    sched.check_integrity()
    assert sched.take_aborted() == [] and sched.num_aborted == 0
    assert sched.recorder.build().status[0] == STATUS_FINISHED


@pytest.mark.parametrize("mode", MODES)
def test_abort_mid_prefill_keeps_the_queued_prefill_count(mode):
    sched = scheduler(mode, budget=8, max_seqs=4)
    sched.add(req(0, prompt=40, out=4))
    sched.add(req(1, prompt=20, out=4))
    step(sched)  # request 0 takes a chunk of 8
    assert sched.running[0].is_prefill
    assert sched.abort(0) and sched.abort(1)  # one running in prefill, one waiting
    sched.check_integrity()
    assert sched.queued_prefill_tokens == 0 and sched.pool.num_used == 0
    assert not sched.has_work and sched.num_aborted == 2


@pytest.mark.parametrize("mode", MODES)
def test_abort_of_a_preempted_request(mode):
    # 6 blocks of 4 tokens: two requests of 8 + 12 tokens cannot both reach the end
    sched = scheduler(mode, num_blocks=6, max_seqs=2)
    sched.add(req(0, prompt=8, out=12))
    sched.add(req(1, prompt=8, out=12))
    preempted = None
    for _ in range(30):
        plan = step(sched)
        if plan.preempted:
            preempted = plan.preempted[0]
            break
    assert preempted is not None and preempted.status is RequestStatus.WAITING
    assert sched.abort(preempted.request_id)
    sched.check_integrity()
    while sched.has_work:
        step(sched)
    assert sched.pool.num_used == 0
    sched.recorder.build().check()


def test_unknown_ids_and_requests_in_transfer():
    sched = scheduler()
    assert not sched.abort(7)
    r = req(0)
    r.status = RequestStatus.TRANSFERRING
    sched._handed[0] = r  # as a prefill replica holds a handed-off request
    with pytest.raises(ValueError, match="KV transfer"):
        sched.abort(0)


@pytest.mark.parametrize("policy", policy_names())
def test_random_aborts_keep_every_invariant_and_both_modes_agree(policy):
    digests = []
    for mode in MODES:
        rng = random.Random(11)
        reqs = random_requests(rng, 40, max_prompt=30, max_output=30)
        sched = scheduler(mode, num_blocks=24, policy=policy, budget=24, max_seqs=6)
        pending = sorted(reqs, key=lambda r: r.arrival_time)
        now, i, aborted = 0.0, 0, 0
        while i < len(pending) or sched.has_work:
            while i < len(pending) and pending[i].arrival_time <= now:
                sched.add(pending[i])
                i += 1
            if rng.random() < 0.15:  # at a boundary, or with the plan pending
                aborted += sched.abort(rng.randrange(len(reqs)))
            if not sched.has_work:
                now = pending[i].arrival_time if i < len(pending) else now
                continue
            plan = sched.schedule(now)
            if rng.random() < 0.1:
                aborted += sched.abort(rng.randrange(len(reqs)))
            sched.update(plan, StepResult(0.01, finished(plan)), now + 0.01)
            now += 0.01
            sched.check_integrity()
            sched.take_aborted()
        assert sched.pool.num_used == 0 and aborted > 0
        rec = sched.recorder.build()
        rec.check()
        digests.append(rec.digest())
    assert digests[0] == digests[1]
