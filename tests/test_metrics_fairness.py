from __future__ import annotations

import numpy as np
import pytest
from test_metrics_build import UNF, Req, Step, make_records

from horizon.metrics import fairness_jain, jain_index, min_steps, slowdown


def test_jain_index_extremes_and_a_hand_value():
    assert jain_index(np.array([2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert jain_index(np.array([0.0, 0.0, 5.0, 0.0])) == pytest.approx(1 / 4)
    assert jain_index(np.array([1.0, 3.0])) == pytest.approx(16 / 20)
    assert jain_index(np.array([1.0, np.nan, 3.0])) == pytest.approx(16 / 20)


def test_jain_index_undefined_and_invalid():
    assert np.isnan(jain_index(np.array([])))
    assert np.isnan(jain_index(np.array([0.0, 0.0])))
    with pytest.raises(ValueError, match="non-negative"):
        jain_index(np.array([1.0, -1.0]))


def _steps(d=0.1, budget=100):
    return [Step(i * d, (i + 1) * d, budget=budget) for i in range(10)]


def _run(d=0.1):
    return make_records(
        [
            # ceil(150 / 100) = 2 prefill steps + 2 decode steps = 4 steps; E2E 0.5
            Req(0.0, (0.3, 0.4, 0.5), prompt=150),
            # 1 prefill step; E2E 0.2
            Req(0.0, (0.2,), prompt=50),
            Req(0.0, (0.9, 1.0), UNF, prompt=10),
        ],
        _steps(d),
    )


def test_slowdown_by_hand():
    rec = _run()
    np.testing.assert_allclose(min_steps(rec), [4, 1, 2])
    np.testing.assert_allclose(slowdown(rec), [0.5 / 0.4, 0.2 / 0.1, np.nan])
    s = np.array([1.25, 2.0])
    assert fairness_jain(rec) == pytest.approx(s.sum() ** 2 / (2 * (s * s).sum()))


def test_fairness_does_not_depend_on_the_step_time_but_slowdown_does():
    fast, slow = _run(d=0.1), _run(d=0.3)
    np.testing.assert_allclose(slowdown(slow)[:2], slowdown(fast)[:2] / 3)
    assert fairness_jain(slow) == pytest.approx(fairness_jain(fast))


def test_equal_slowdowns_give_one():
    # Both need 1 + 1 steps and take 0.4 s: equal slowdowns.
    rec = make_records(
        [Req(0.0, (0.3, 0.4), prompt=100), Req(1.0, (1.2, 1.4), prompt=20)], _steps()
    )
    assert fairness_jain(rec) == pytest.approx(1.0)


def test_no_steps_gives_nan():
    rec = make_records([Req(0.0, (0.3,))])
    assert np.isnan(slowdown(rec)).all()
    assert np.isnan(fairness_jain(rec))
