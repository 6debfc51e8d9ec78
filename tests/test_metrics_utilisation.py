from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import Step, make_records

from horizon.metrics import kv_utilisation, kv_utilisation_max, kv_utilisation_mean


def test_kv_utilisation_series_and_duration_weighted_mean():
    rec = make_records(
        [],
        [Step(0.0, 1.0, kv_used=2), Step(1.0, 3.0, kv_used=5), Step(5.0, 6.0, kv_used=10)],
        num_kv_blocks=10,
    )
    t, u = kv_utilisation(rec)
    assert t.tolist() == [1.0, 3.0, 6.0]
    np.testing.assert_allclose(u, [0.2, 0.5, 1.0])
    # Weights 1, 2, 1 s; the idle gap 3..5 is not counted.
    assert kv_utilisation_mean(rec) == pytest.approx((0.2 * 1 + 0.5 * 2 + 1.0 * 1) / 4)
    assert kv_utilisation_max(rec) == 1.0


def test_zero_duration_steps_fall_back_to_plain_mean():
    rec = make_records([], [Step(1.0, 1.0, kv_used=1), Step(1.0, 1.0, kv_used=4)], num_kv_blocks=4)
    assert kv_utilisation_mean(rec) == pytest.approx((0.25 + 1.0) / 2)


def test_no_steps_or_no_blocks_is_nan():
    assert np.isnan(kv_utilisation_mean(make_records([])))
    assert np.isnan(kv_utilisation_max(make_records([])))
    no_blocks = make_records([], [Step(0.0, 1.0, kv_used=0)], num_kv_blocks=0)
    assert np.isnan(kv_utilisation_mean(no_blocks))
    assert np.isnan(kv_utilisation(no_blocks)[1]).all()
