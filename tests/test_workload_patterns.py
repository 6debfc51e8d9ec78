"""Arrival patterns: counts per window against the integrated rate, seeding, thinning's bound,
empirical trace rates, trace rescaling and windows, validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from horizon.workload import patterns as P
from horizon.workload.azure_trace import load_azure_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONV = DATA / "AzureLLMInferenceTrace_conv.csv.gz"
CODE = DATA / "AzureLLMInferenceTrace_code.csv.gz"

PATTERNS = {
    "constant": P.constant(5.0),
    "step": P.step([10.0, 40.0, 0.0, 20.0], [60.0, 60.0, 30.0, 30.0]),
    "step_repeat": P.step([10.0, 40.0], 30.0, repeat=True),
    "diurnal": P.diurnal(100.0, 0.8, 60.0),
    "spike_rect": P.spike(10.0, 200.0, 20.0, 10.0),
    "spike_smooth": P.spike(10.0, 200.0, 20.0, 10.0, shape="smooth"),
    "dip": P.spike(50.0, 5.0, 20.0, 30.0, shape="smooth"),
    "trace": P.from_trace(np.array([3.0, 3.5, 4.0, 9.0, 12.5, 12.6, 12.7]), bin_s=2.0),
}


def _trace_times(path: Path) -> np.ndarray:
    if not path.exists():
        pytest.skip(f"{path} absent (Azure trace data lives outside the repo, ../shared/data)")
    return load_azure_trace(path).times


def _assert_poisson_counts(times: np.ndarray, pattern: P.RatePattern, edges: np.ndarray) -> None:
    """Every window's count within 4 sigma of its Poisson mean, the integrated rate."""
    counts, _ = np.histogram(times, edges)
    expected = np.diff(np.asarray(pattern.cumulative(edges)))
    assert expected.min() >= 30, "windows too small for a 4-sigma test"
    z = (counts - expected) / np.sqrt(expected)
    assert np.all(np.abs(z) < 4), f"worst window z = {z[np.argmax(np.abs(z))]:.2f}"
    assert abs(z.mean()) < 4 / np.sqrt(len(z))  # no bias across windows


def test_step_counts_per_window():
    pattern = P.step([100.0, 400.0, 50.0], [60.0, 60.0, 60.0])
    times = P.arrivals(pattern, 180.0, np.random.default_rng(1))
    _assert_poisson_counts(times, pattern, np.arange(0.0, 181.0, 5.0))
    # the segments themselves: 6,000 / 24,000 / 3,000 expected
    _assert_poisson_counts(times, pattern, np.array([0.0, 60.0, 120.0, 180.0]))


def test_diurnal_counts_per_window():
    pattern = P.diurnal(300.0, 0.9, 100.0)
    times = P.arrivals(pattern, 400.0, np.random.default_rng(2))
    _assert_poisson_counts(times, pattern, np.arange(0.0, 401.0, 5.0))
    peak, trough = np.histogram(times, [20.0, 30.0, 70.0, 80.0])[0][[0, 2]]
    assert peak > 10 * trough  # 570/s vs 30/s around t = 25 and t = 75


@pytest.mark.parametrize("shape", P.SPIKE_SHAPES)
def test_spike_counts_per_window(shape):
    pattern = P.spike(50.0, 1000.0, 30.0, 10.0, shape=shape)
    times = P.arrivals(pattern, 80.0, np.random.default_rng(3))
    _assert_poisson_counts(times, pattern, np.arange(0.0, 81.0, 2.0))
    inside = np.count_nonzero((times >= 30.0) & (times < 40.0))
    extra = 9_500 if shape == "rect" else 4_750  # (peak - base) * width (half for smooth)
    assert abs(inside - (500 + extra)) < 4 * np.sqrt(500 + extra)


@pytest.mark.parametrize("name", PATTERNS)
def test_cumulative_is_the_integral_of_rate(name):
    pattern = PATTERNS[name]
    grid = np.linspace(0.0, 200.0, 400_001)
    r = np.asarray(pattern.rate(grid))
    trapezoid = np.concatenate(([0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(grid))))
    # jumps cost at most one grid cell's worth of rate each
    assert np.allclose(pattern.cumulative(grid), trapezoid, atol=pattern.max_rate * 0.01)
    assert np.all(r >= 0) and r.max() <= pattern.max_rate
    assert pattern.cumulative(0.0) == 0.0


def test_mean_rate_and_what_follows_a_step():
    assert P.constant(5.0).mean_rate(10.0) == pytest.approx(5.0)
    s = P.step([10.0, 40.0], [60.0, 60.0])
    assert s.mean_rate(60.0) == pytest.approx(10.0) and s.mean_rate(120.0) == pytest.approx(25.0)
    assert s.cumulative(180.0) == pytest.approx(600 + 2_400 + 2_400)  # last rate holds
    cyc = P.step([10.0, 40.0], [60.0, 60.0], repeat=True)
    assert cyc.cumulative(300.0) == pytest.approx(2 * 3_000 + 600)
    assert cyc.rate(130.0) == 10.0 and cyc.rate(190.0) == 40.0
    assert P.diurnal(7.0, 1.0, 50.0).mean_rate(150.0) == pytest.approx(7.0)
    assert P.diurnal(7.0, 1.0, 50.0).max_rate == 14.0
    assert P.spike(10.0, 30.0, 5.0, 4.0).mean_rate(20.0) == pytest.approx(10 + 20 * 4 / 20)
    smooth = P.spike(10.0, 30.0, 5.0, 4.0, shape="smooth")
    assert smooth.mean_rate(20.0) == pytest.approx(10 + 20 * 2 / 20)
    assert smooth.rate(7.0) == pytest.approx(30.0) and smooth.rate(5.0) == pytest.approx(10.0)


def test_rate_is_scalar_or_vectorised():
    d = P.diurnal(10.0, 0.5, 40.0)
    assert isinstance(d.rate(10.0), float) and d.rate(10.0) == pytest.approx(15.0)
    grid = np.array([[0.0, 10.0], [20.0, 30.0]])
    assert np.allclose(d.rate(grid), [[10.0, 15.0], [10.0, 5.0]])
    assert np.asarray(d.cumulative(grid)).shape == (2, 2)


def test_same_seed_same_times_different_seed_different_times():
    pattern = PATTERNS["step"]
    a = P.arrivals(pattern, 180.0, np.random.default_rng(7))
    b = P.arrivals(pattern, 180.0, np.random.default_rng(7))
    c = P.arrivals(pattern, 180.0, np.random.default_rng(8))
    assert np.array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


@pytest.mark.parametrize("name", PATTERNS)
def test_arrivals_are_sorted_in_window_and_within_max_rate(name):
    pattern = PATTERNS[name]
    times = P.arrivals(pattern, 150.0, np.random.default_rng(4))
    assert times.dtype == np.float64 and times.ndim == 1 and len(times) > 0
    assert np.all(np.diff(times) >= 0) and times[0] >= 0 and times[-1] < 150.0
    assert np.all(np.asarray(pattern.rate(times)) <= pattern.max_rate)
    assert np.all(np.asarray(pattern.rate(times)) > 0)  # never kept where the rate is 0


def test_a_rate_above_max_rate_is_refused():
    class Understated(P.Constant):
        @property
        def max_rate(self) -> float:
            return self.value / 2

    with pytest.raises(ValueError, match="exceeds pattern.max_rate"):
        P.arrivals(Understated(10.0), 10.0, np.random.default_rng(0))


def test_many_arrivals_in_chunks():
    pattern = P.diurnal(2_000.0, 1.0, 30.0)  # ~200,000 arrivals, 400,000 candidates
    times = P.arrivals(pattern, 100.0, np.random.default_rng(5))
    assert abs(len(times) - pattern.cumulative(100.0)) < 4 * np.sqrt(pattern.cumulative(100.0))
    _assert_poisson_counts(times, pattern, np.arange(0.0, 101.0, 2.5))
    tiny = P.arrivals(P.constant(0.01), 1.0, np.random.default_rng(5))
    assert tiny.shape == (0,) and tiny.dtype == np.float64  # an empty window is an empty array


def test_from_trace_bins_counts_exactly():
    times = np.array([100.0, 100.2, 101.9, 102.0, 105.5, 105.5, 107.99])
    pattern = P.from_trace(times, bin_s=2.0, scale=3.0)
    # relative to the first arrival: bins [0,2) [2,4) [4,6) [6,8) hold 3, 1, 2, 1
    assert np.allclose(pattern.rates, 3.0 * np.array([3, 1, 2, 1]) / 2.0)
    assert np.allclose(pattern.cumulative(pattern.edges), 3.0 * np.array([0, 3, 4, 6, 7]))
    assert P.from_trace(np.array([4.0]), bin_s=1.0).max_rate == 1.0


def test_from_trace_reproduces_conv_bin_counts():
    times = _trace_times(CONV)
    pattern = P.from_trace(times, bin_s=60.0)
    counts = np.bincount((times // 60.0).astype(int))
    edges = pattern.edges
    assert np.array_equal(np.diff(np.asarray(pattern.cumulative(edges))), counts)
    synthetic = P.arrivals(pattern, float(edges[-1]), np.random.default_rng(6))
    _assert_poisson_counts(synthetic, pattern, edges)  # each minute: the trace's count, +- 4 sigma
    doubled = P.from_trace(times, bin_s=60.0, scale=2.0)
    assert np.allclose(np.diff(np.asarray(doubled.cumulative(edges))), 2 * counts)


def test_rescale_to_a_rate_keeps_the_gaps_shape():
    rng = np.random.default_rng(9)
    times = 50.0 + np.cumsum(rng.gamma(0.3, 1.0, size=2_000))
    out = P.rescale_trace(times, 12.0)
    assert out[0] == 0.0 and (len(out) - 1) / out[-1] == pytest.approx(12.0)
    assert np.allclose(out, (times - times[0]) * (out[-1] / (times[-1] - times[0])), rtol=1e-12)
    cv = [np.diff(t).std() / np.diff(t).mean() for t in (times, out)]
    assert cv[0] > 1.5 and cv[1] == pytest.approx(cv[0], rel=1e-9)  # as bursty as the trace


def _count_error(out: np.ndarray, pattern: P.RatePattern, grid: np.ndarray) -> float:
    so_far = np.searchsorted(out, grid, side="right")
    return float(np.max(np.abs(so_far - np.asarray(pattern.cumulative(grid)))))


def test_rescale_to_a_pattern_follows_it_within_one_bin():
    rng = np.random.default_rng(10)
    times = np.sort(rng.uniform(0.0, 1_000.0, size=5_000))
    target = P.step([2.0, 8.0], [500.0, 500.0])
    out = P.rescale_trace(times, target, bin_s=10.0)
    assert len(out) == 5_000 and out[0] == 0.0 and np.all(np.diff(out) >= 0)
    largest_bin = np.bincount(((times - times[0]) // 10.0).astype(int)).max()
    assert _count_error(out, target, np.linspace(0.0, out[-1], 2_001)) <= largest_bin
    assert out[-1] == pytest.approx(500 + 4_000 / 8, rel=0.01)


def test_rescale_code_trace_keeps_its_burstiness():
    times = _trace_times(CODE)
    target = P.diurnal(4.0, 0.8, 600.0)
    out = P.rescale_trace(times, target, bin_s=10.0)
    largest_bin = np.bincount(((times - times[0]) // 10.0).astype(int)).max()
    assert _count_error(out, target, np.linspace(0.0, out[-1], 5_001)) <= largest_bin
    flat = P.cut_window(P.rescale_trace(times, P.constant(3.0)), 0.0, 2_400.0)
    poisson = P.arrivals(P.constant(3.0), 2_400.0, np.random.default_rng(11))

    def dispersion(t: np.ndarray) -> float:  # variance / mean of counts per second
        c = np.bincount(t.astype(int), minlength=2_400)
        return float(c.var() / c.mean())

    assert dispersion(poisson) < 1.3 and dispersion(flat) > 3.0


def test_cut_window():
    times = np.array([0.5, 1.0, 2.0, 2.0, 3.5, 4.0])
    assert np.array_equal(P.cut_window(times, 1.0, 4.0), [0.0, 1.0, 1.0, 2.5])
    assert P.cut_window(times, 10.0, 20.0).shape == (0,)
    assert P.cut_window(np.array([]), 0.0, 1.0).shape == (0,)


def test_rescale_to_an_unreachable_pattern():
    with pytest.raises(ValueError, match="target's cumulative count never reaches 101"):
        P.rescale_trace(np.arange(101.0), P.step([1.0, 0.0], [10.0, 10.0]))


RNG = np.random.default_rng(0)
BAD = [
    (lambda: P.constant(0.0), "rate must be"),
    (lambda: P.constant(float("nan")), "rate must be"),
    (lambda: P.step([1.0, -1.0], 1.0), "rates must be"),
    (lambda: P.step([0.0, 0.0], 1.0), "rates must be"),
    (lambda: P.step([], 1.0), "rates must be"),
    (lambda: P.step([1.0, 2.0], [1.0]), "durations must have 2"),
    (lambda: P.step([1.0, 2.0], [1.0, 0.0]), "durations must"),
    (lambda: P.step([1.0], 1.0, repeat=1), "repeat must"),
    (lambda: P.diurnal(0.0, 0.5, 10.0), "mean must"),
    (lambda: P.diurnal(1.0, 1.5, 10.0), "amplitude must"),
    (lambda: P.diurnal(1.0, -0.1, 10.0), "amplitude must"),
    (lambda: P.diurnal(1.0, 0.5, 0.0), "period must"),
    (lambda: P.spike(-1.0, 2.0, 0.0, 1.0), "base must"),
    (lambda: P.spike(1.0, float("inf"), 0.0, 1.0), "peak must"),
    (lambda: P.spike(0.0, 0.0, 0.0, 1.0), "base and peak"),
    (lambda: P.spike(1.0, 2.0, -1.0, 1.0), "start must"),
    (lambda: P.spike(1.0, 2.0, 0.0, 0.0), "width must"),
    (lambda: P.spike(1.0, 2.0, 0.0, 1.0, shape="gauss"), r"shape must be one of \('rect'"),
    (lambda: P.from_trace(np.array([]), 1.0), "times must be a non-empty"),
    (lambda: P.from_trace(np.array([2.0, 1.0]), 1.0), "times must be non-decreasing"),
    (lambda: P.from_trace(np.array([1.0, np.nan]), 1.0), "times must be finite"),
    (lambda: P.from_trace(np.array([1.0]), 0.0), "bin_s must"),
    (lambda: P.from_trace(np.array([1.0]), 1.0, scale=-2.0), "scale must"),
    (lambda: P.arrivals("constant", 1.0, RNG), "pattern must be a RatePattern"),
    (lambda: P.arrivals(P.constant(1.0), 0.0, RNG), "duration must"),
    (lambda: P.arrivals(P.constant(1.0), 1.0, 42), "rng must"),
    (lambda: P.constant(1.0).mean_rate(-1.0), "duration must"),
    (lambda: P.rescale_trace(np.array([1.0, 2.0]), 0.0), "target must"),
    (lambda: P.rescale_trace(np.array([1.0, 1.0]), 2.0), "times must span more than one instant"),
    (lambda: P.rescale_trace(np.array([1.0, 2.0]), 2.0, bin_s=-1.0), "bin_s must"),
    (lambda: P.cut_window(np.array([1.0]), -1.0, 2.0), "start must"),
    (lambda: P.cut_window(np.array([1.0]), 2.0, 2.0), "end must be > start"),
    (lambda: P.cut_window(np.ones((2, 2)), 0.0, 2.0), "times must be a 1-d"),
]


@pytest.mark.parametrize(("call", "message"), BAD)
def test_bad_arguments_raise_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
