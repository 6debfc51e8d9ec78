"""Arrival processes: rates, burstiness, replay scaling and wrap-around, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from horizon.workload.arrivals import gamma, poisson, replay

N = 20_000


def _rate(times: np.ndarray) -> float:
    return (len(times) - 1) / times[-1]


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def _check_shape(times: np.ndarray, n: int) -> None:
    assert times.dtype == np.float64 and times.shape == (n,)
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)


def test_poisson_mean_rate_and_cv():
    times = poisson(5.0, N, np.random.default_rng(1))
    _check_shape(times, N)
    assert _rate(times) == pytest.approx(5.0, rel=0.03)
    assert _cv(times) == pytest.approx(1.0, rel=0.03)


def test_same_seed_same_times_different_seed_different_times():
    a = poisson(2.0, 100, np.random.default_rng(7))
    b = poisson(2.0, 100, np.random.default_rng(7))
    c = poisson(2.0, 100, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_rate_and_cv(burstiness):
    times = gamma(3.0, burstiness, N, np.random.default_rng(2))
    _check_shape(times, N)
    assert _rate(times) == pytest.approx(3.0, rel=0.04)
    assert _cv(times) == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_single_arrival_is_at_zero():
    assert poisson(1.0, 1, np.random.default_rng(0)).tolist() == [0.0]


def test_replay_is_relative_to_the_first_and_scaled():
    ts = np.array([100.0, 101.0, 103.0, 107.0])
    assert replay(ts, 4).tolist() == [0.0, 1.0, 3.0, 7.0]
    assert replay(ts, 3, rate_scale=2.0).tolist() == [0.0, 0.5, 1.5]
    assert replay(ts, 4, rate_scale=0.5).tolist() == [0.0, 2.0, 6.0, 14.0]


def test_replay_wraps_around_after_one_mean_gap():
    ts = np.array([10.0, 11.0, 13.0])  # scaled by 2: 0, 0.5, 1.5; mean gap 0.75
    times = replay(ts, 7, rate_scale=2.0)
    assert times == pytest.approx([0.0, 0.5, 1.5, 2.25, 2.75, 3.75, 4.5])
    assert np.all(np.diff(times) >= 0)


def test_replay_keeps_the_trace_rate_when_wrapping():
    ts = np.cumsum(np.random.default_rng(3).exponential(0.1, 1000))
    times = replay(ts, 5000, rate_scale=4.0)
    assert _rate(times) == pytest.approx(4 * _rate(ts - ts[0]), rel=1e-3)


@pytest.mark.parametrize("rate", [0, -1.0, math.nan, math.inf, "2", True])
def test_bad_rate(rate):
    with pytest.raises(ValueError, match="rate"):
        poisson(rate, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="rate"):
        gamma(rate, 1.0, 10, np.random.default_rng(0))


@pytest.mark.parametrize("burstiness", [0, -0.5, math.nan, math.inf])
def test_bad_burstiness(burstiness):
    with pytest.raises(ValueError, match="burstiness"):
        gamma(1.0, burstiness, 10, np.random.default_rng(0))


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_bad_n(n):
    with pytest.raises(ValueError, match="n must be"):
        poisson(1.0, n, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n must be"):
        replay(np.array([0.0, 1.0]), n)


def test_rng_must_be_a_generator():
    with pytest.raises(ValueError, match="Generator"):
        poisson(1.0, 10, 42)


def test_bad_replay_inputs():
    with pytest.raises(ValueError, match="non-decreasing"):
        replay(np.array([0.0, 2.0, 1.0]), 3)
    with pytest.raises(ValueError, match="finite"):
        replay(np.array([0.0, math.nan]), 2)
    with pytest.raises(ValueError, match="non-empty"):
        replay(np.array([]), 2)
    with pytest.raises(ValueError, match="rate_scale"):
        replay(np.array([0.0, 1.0]), 2, rate_scale=0.0)
    with pytest.raises(ValueError, match="one-element"):
        replay(np.array([5.0]), 2)
    assert replay(np.array([5.0]), 1).tolist() == [0.0]
