"""A step loop for speculative-decoding tests: the Scheduler over the simulator's backend with a
stated acceptance model, checking after every step what a verification must guarantee."""

from __future__ import annotations

from sched_driver import ConstantCost, policy_for_test

from horizon.acceptance import AcceptanceModel
from horizon.kv_cache import chained_block_hashes
from horizon.metrics.records import RunRecords
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.spec_tracks import ModelDraws
from horizon.workload.builder import fresh_copy
from simulator.backend import SimBackend


def fresh(reqs: list[Request]) -> list[Request]:
    """Unscheduled copies of ``reqs``."""
    return [fresh_copy(r) for r in reqs]


def assert_hash_chains(sched: Scheduler) -> None:
    """Every hashed block a running request holds sits at its place in the request's prompt
    chain: no generated or draft token was ever published."""
    bs, kv, pool = sched.config.block_size, sched.kv, sched.pool
    for r in sched.running.values():
        hashes = chained_block_hashes(r.prompt_token_ids or (), bs)
        for i, b in enumerate(kv.blocks_of(r)):
            h = pool.hash_of(b)
            if h is not None:
                assert i < len(hashes) and h == hashes[i], f"block {i} of {r.request_id}"


def drive_spec(
    requests: list[Request],
    config: SchedulerConfig,
    policy: str,
    acceptance: AcceptanceModel,
    check: bool = True,
    draws: bool = False,
) -> tuple[Scheduler, RunRecords, dict]:
    """Run to completion; after every step: integrity, hash chains, the step within its token
    budget, and each verifying request advanced by exactly its accepted drafts plus one.
    Returns the scheduler, its records and totals (steps, verifies, accepted drafts).
    ``draws``: the scheduler draws acceptance ahead where it can (``ModelDraws``)."""
    source = ModelDraws(acceptance) if draws else None
    sched = Scheduler(config, policy_for_test(policy), draws=source)
    event = config.step_mode == "event"
    backend = SimBackend(ConstantCost(), event, acceptance=acceptance, drawn=sched.draws_ahead)
    pending = sorted(requests, key=lambda r: r.arrival_time)
    now, i = 0.0, 0
    totals = {"steps": 0, "verifies": 0, "accepted": 0, "drafted": 0}
    while i < len(pending) or sched.has_work:
        while i < len(pending) and pending[i].arrival_time <= now:
            sched.add(pending[i])
            i += 1
        if not sched.has_work:
            if i < len(pending):
                now = pending[i].arrival_time
            continue
        plan = sched.schedule(now)
        assert plan.num_tokens <= config.max_num_batched_tokens
        assert all(k >= 1 for _, k in plan.verifies)
        assert not {r.request_id for r in plan.decodes} & {r.request_id for r, _ in plan.verifies}
        before = [(r, r.num_output_tokens) for r, _ in plan.verifies]
        result = backend.execute(plan)
        now += result.duration if result.duration else 0.001
        sched.update(plan, result, now)
        for (r, g), a, (_, k) in zip(before, result.accepted, plan.verifies):
            assert 0 <= a <= k and r.num_output_tokens == g + a + 1
        totals["steps"] += 1
        totals["verifies"] += len(plan.verifies)
        totals["accepted"] += int(sum(result.accepted))
        totals["drafted"] += sum(k for _, k in plan.verifies)
        if check:
            sched.check_integrity()
            assert_hash_chains(sched)
        assert totals["steps"] < 200_000, "no progress"
    sched.finish_run()
    sched.check_integrity()
    return sched, sched.recorder.build(), totals
