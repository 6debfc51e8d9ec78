"""Scheduler property tests: random arrivals, lengths, chunk budgets, shared prefixes and
preemptions, with check_integrity() after every step, in both step modes."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_driver import drive, random_requests

from horizon.metrics.records import STATUS_FINISHED, STATUS_REJECTED
from horizon.policies import policy_names
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.builder import fresh_copy


def test_random_workloads_keep_every_invariant_and_both_modes_agree(scale):
    total = 0
    preempting_examples = 0

    @settings(max_examples=300 * scale, deadline=None, derandomize=True)
    @given(
        seed=st.integers(0, 2**32),
        policy=st.sampled_from(policy_names()),
        num_blocks=st.integers(4, 48),
        block_size=st.sampled_from([1, 2, 4, 16]),
        max_seqs=st.integers(1, 8),
        extra_budget=st.integers(0, 40),
        prefix=st.booleans(),
    )
    def run(seed, policy, num_blocks, block_size, max_seqs, extra_budget, prefix):
        nonlocal total, preempting_examples
        rng = random.Random(seed)
        reqs = random_requests(rng, 30, max_prompt=40, max_output=30)
        digests = []
        for mode in ("event", "reference"):
            cfg = SchedulerConfig(
                num_blocks=num_blocks,
                block_size=block_size,
                max_num_seqs=max_seqs,
                max_num_batched_tokens=max(2, max_seqs + extra_budget),
                max_model_len=10_000,
                enable_prefix_caching=prefix,
                step_mode=mode,
            )
            fresh = [fresh_copy(r) for r in reqs]
            sched, rec, ops = drive(fresh, cfg, policy)
            total += ops
            rec.check()
            # nothing silently dropped: every request finished with its true length, or was
            # rejected with a reason because it could never fit
            done = rec.status == STATUS_FINISHED
            rej = rec.status == STATUS_REJECTED
            assert np.all(done | rej)
            assert all(rec.reject_reason[i] for i in np.flatnonzero(rej))
            assert sched.pool.num_used == 0
            if policy == "memory_first":
                assert rec.num_preemptions.sum() == 0
            preempting_examples += rec.num_preemptions.sum() > 0
            digests.append(rec.digest())
        assert digests[0] == digests[1]

    run()
    assert total >= 100_000 * scale
    assert preempting_examples > 0  # the generator really exercises preemption
