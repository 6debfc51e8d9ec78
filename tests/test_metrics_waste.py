from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import Req, Step, make_records, synthetic_records

from horizon.metrics import (
    preempted_requests,
    preemptions,
    prefill_chunk_waste,
    recompute_waste,
)


def test_recompute_waste_and_preemption_counts():
    rec = make_records(
        [
            Req(0.0, (1.0,), computed=100, recomputed=20, preemptions=2),
            Req(0.0, (1.0,), computed=50),
            Req(0.0, (1.0,), computed=0, preemptions=1),
        ]
    )
    assert recompute_waste(rec) == pytest.approx(20 / 150)
    assert preemptions(rec) == 3
    assert preempted_requests(rec) == 2


def test_prefill_chunk_waste_counts_only_steps_with_requests_waiting():
    rec = make_records(
        [],
        [
            Step(0.0, 1.0, prefill=60, decode=10, waiting=2, budget=100),  # 30 unused
            Step(1.0, 2.0, prefill=0, decode=5, waiting=0, budget=100),  # nobody waits
            Step(2.0, 3.0, prefill=40, decode=5, waiting=1, budget=50),  # 5 unused
        ],
    )
    assert prefill_chunk_waste(rec) == pytest.approx(35 / 150)


def test_waste_is_nan_when_undefined():
    nobody_waits = make_records([], [Step(0.0, 1.0, decode=3, waiting=0, budget=100)])
    assert np.isnan(prefill_chunk_waste(nobody_waits))
    assert np.isnan(recompute_waste(make_records([])))
    assert preemptions(make_records([])) == 0


def test_prefix_hit_rate_is_cached_over_cached_plus_prefill_computed():
    from horizon.metrics import prefix_hit_rate

    rec = synthetic_records(50, 20, seed=3)
    cached, prefill = rec.cached_tokens.sum(), rec.prefill_tokens.sum()
    assert prefix_hit_rate(rec) == pytest.approx(cached / (cached + prefill))
    assert 0 < prefix_hit_rate(rec) < 1
