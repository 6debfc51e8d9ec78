"""Arrival patterns whose rate changes over time, for autoscaling studies.

A ``RatePattern`` is a rate function ``rate(t)`` (requests/s, ``t`` in seconds from 0) with its
integral ``cumulative(t)`` (the expected number of arrivals in ``[0, t)``) and a bound
``max_rate``. Built in: ``constant``, ``step`` (piecewise constant), ``diurnal`` (a sinusoid),
``spike`` (a base rate with a rectangular or smooth burst) and ``from_trace`` (the binned
empirical rate of recorded arrival times).

Two ways to get arrival times with that shape, each a sorted float64 array of seconds:

- ``arrivals(pattern, duration, rng)``: a non-homogeneous Poisson process on ``[0, duration)``
  by Lewis–Shedler thinning. Randomness comes only from the ``numpy.random.Generator`` passed in.
- ``rescale_trace(times, target)``: a recorded trace (e.g. ``load_azure_trace(path).times``)
  replayed on a new time axis, so it keeps the trace's own burstiness; ``cut_window`` takes a
  slice of the result.

Unlike ``arrivals.py`` the first arrival is not forced to ``t = 0``: these generators return
what falls in a time window, not a fixed count.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real

import numpy as np

from horizon.workload.arrivals import _check_rng

SPIKE_SHAPES = ("rect", "smooth")
_MAX_CHUNK = 1 << 20  # candidate times drawn per thinning chunk, at most


class RatePattern(ABC):
    """A rate function of time, ``t >= 0`` in seconds, in requests/s.

    Contract for subclasses: ``0 <= rate(t) <= max_rate`` for every ``t >= 0``, ``max_rate``
    finite and > 0, and ``cumulative(t)`` the integral of ``rate`` over ``[0, t)`` (so
    non-decreasing, ``cumulative(0) == 0``). ``arrivals`` raises if ``rate`` exceeds
    ``max_rate`` at a candidate time. Patterns are immutable.
    """

    @property
    @abstractmethod
    def max_rate(self) -> float:
        """An upper bound of ``rate(t)`` over all ``t >= 0`` (the thinning rate)."""

    @abstractmethod
    def _rate(self, t: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _cumulative(self, t: np.ndarray) -> np.ndarray: ...

    def rate(self, t: float | np.ndarray) -> float | np.ndarray:
        """The rate at ``t`` (a float for a scalar ``t``, else a float64 array of its shape)."""
        return _like(t, self._rate(np.asarray(t, dtype=np.float64)))

    def cumulative(self, t: float | np.ndarray) -> float | np.ndarray:
        """Expected number of arrivals in ``[0, t)``: the integral of ``rate`` (vectorised)."""
        return _like(t, self._cumulative(np.asarray(t, dtype=np.float64)))

    def mean_rate(self, duration: float) -> float:
        """Mean rate over ``[0, duration)``: ``cumulative(duration) / duration``.

        Raises:
            ValueError: ``duration`` not a finite number > 0.
        """
        _check_real(duration, "duration", strict=True)
        return float(self.cumulative(duration)) / duration


@dataclass(frozen=True)
class Constant(RatePattern):
    """A constant ``value`` requests/s (a homogeneous Poisson process under ``arrivals``)."""

    value: float

    def __post_init__(self) -> None:
        _check_real(self.value, "rate", strict=True)

    @property
    def max_rate(self) -> float:
        return float(self.value)

    def _rate(self, t: np.ndarray) -> np.ndarray:
        return np.full_like(t, self.value)

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        return self.value * t


@dataclass(frozen=True, eq=False)
class Step(RatePattern):
    """Piecewise constant: ``rates[i]`` requests/s for ``durations[i]`` seconds, in order.

    Past the last segment the pattern cycles from the start if ``repeat``, else the last rate
    holds. ``rates`` and ``durations`` are stored as read-only float64 arrays of equal length.
    """

    rates: np.ndarray
    durations: np.ndarray
    repeat: bool = False

    def __post_init__(self) -> None:
        rates = _read_only(np.asarray(self.rates, dtype=np.float64), "rates")
        if np.any(rates < 0) or not np.any(rates > 0):
            raise ValueError("rates must be >= 0 with at least one > 0 (requests/s)")
        durations = np.asarray(self.durations, dtype=np.float64)
        if durations.ndim == 0:
            durations = np.full(len(rates), float(durations))
        durations = _read_only(durations, "durations")
        if durations.shape != rates.shape:
            raise ValueError(f"durations must have {len(rates)} entries, one per rate")
        if np.any(durations <= 0):
            raise ValueError("durations must all be > 0 (seconds)")
        if not isinstance(self.repeat, bool):
            raise ValueError(f"repeat must be a bool, got {self.repeat!r}")
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "durations", durations)

    @property
    def max_rate(self) -> float:
        return float(self.rates.max())

    @property
    def edges(self) -> np.ndarray:
        """Segment boundaries in seconds: ``0, d0, d0 + d1, ..., sum(durations)``."""
        return np.concatenate(([0.0], np.cumsum(self.durations)))

    def _segment(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per ``t``: whole cycles before it (0 unless ``repeat``), its segment, time in it."""
        edges = self.edges
        cycles = np.floor(t / edges[-1]) if self.repeat else np.zeros_like(t)
        within = t - cycles * edges[-1]
        seg = np.clip(np.searchsorted(edges, within, side="right") - 1, 0, len(self.rates) - 1)
        return cycles, seg, within - edges[seg]

    def _rate(self, t: np.ndarray) -> np.ndarray:
        return self.rates[self._segment(t)[1]]

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        cycles, seg, offset = self._segment(t)
        at_edges = np.concatenate(([0.0], np.cumsum(self.rates * self.durations)))
        return cycles * at_edges[-1] + at_edges[seg] + self.rates[seg] * offset


@dataclass(frozen=True)
class Diurnal(RatePattern):
    """``mean * (1 + amplitude * sin(2 pi t / period))``: a day (or any cycle) in one sinusoid."""

    mean: float
    amplitude: float
    period: float

    def __post_init__(self) -> None:
        _check_real(self.mean, "mean", strict=True)
        a = self.amplitude
        if not (isinstance(a, Real) and not isinstance(a, bool) and 0 <= a <= 1):
            raise ValueError(f"amplitude must be a number in [0, 1], got {a!r}")
        _check_real(self.period, "period", strict=True)

    @property
    def max_rate(self) -> float:
        return float(self.mean * (1 + self.amplitude))

    def _rate(self, t: np.ndarray) -> np.ndarray:
        return self.mean * (1 + self.amplitude * np.sin(2 * np.pi * t / self.period))

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        w = 2 * np.pi / self.period
        return self.mean * (t + self.amplitude / w * (1 - np.cos(w * t)))


@dataclass(frozen=True)
class Spike(RatePattern):
    """``base`` requests/s with a burst to ``peak`` over ``[start, start + width)``.

    ``shape="rect"`` jumps to ``peak`` for the whole window; ``"smooth"`` rises and falls as a
    raised cosine that touches ``peak`` at the window's middle (half the extra arrivals of
    ``rect``). A ``peak`` below ``base`` makes a dip.
    """

    base: float
    peak: float
    start: float
    width: float
    shape: str = "rect"

    def __post_init__(self) -> None:
        _check_real(self.base, "base", strict=False)
        _check_real(self.peak, "peak", strict=False)
        if max(self.base, self.peak) <= 0:
            raise ValueError("base and peak must not both be 0 (the pattern would be empty)")
        _check_real(self.start, "start", strict=False)
        _check_real(self.width, "width", strict=True)
        if self.shape not in SPIKE_SHAPES:
            raise ValueError(f"shape must be one of {SPIKE_SHAPES}, got {self.shape!r}")

    @property
    def max_rate(self) -> float:
        return float(max(self.base, self.peak))

    def _rate(self, t: np.ndarray) -> np.ndarray:
        u = t - self.start
        inside = (u >= 0) & (u < self.width)
        bump = (
            np.ones_like(t)
            if self.shape == "rect"
            else 0.5 * (1 - np.cos(2 * np.pi * u / self.width))
        )
        return self.base + (self.peak - self.base) * np.where(inside, bump, 0.0)

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        u = np.clip(t - self.start, 0.0, self.width)
        if self.shape == "rect":
            extra = u
        else:
            extra = 0.5 * (u - self.width / (2 * np.pi) * np.sin(2 * np.pi * u / self.width))
        return self.base * t + (self.peak - self.base) * extra


def constant(rate: float) -> Constant:
    """A constant ``rate`` requests/s. Raises ValueError unless ``rate`` is finite and > 0."""
    return Constant(rate)


def step(rates: Sequence[float], durations: float | Sequence[float], repeat: bool = False) -> Step:
    """Piecewise constant rates, e.g. ``step([10, 40], [60, 60])``: 10 req/s for 60 s, then 40.

    ``durations`` may be one number for equal segments. See ``Step`` for what follows the last
    segment. Raises ValueError for negative or non-finite rates (or all zero), durations not
    > 0 or not one per rate.
    """
    return Step(np.asarray(rates), np.asarray(durations), repeat)


def diurnal(mean: float, amplitude: float, period: float) -> Diurnal:
    """``mean * (1 + amplitude * sin(2 pi t / period))``, ``0 <= amplitude <= 1``.

    Raises ValueError for ``mean`` or ``period`` not finite and > 0, ``amplitude`` outside [0, 1].
    """
    return Diurnal(mean, amplitude, period)


def spike(base: float, peak: float, start: float, width: float, shape: str = "rect") -> Spike:
    """``base`` requests/s with a burst to ``peak`` over ``[start, start + width)`` (see ``Spike``).

    Raises ValueError for negative or non-finite rates (or both 0), ``start < 0``, ``width``
    not > 0, or an unknown ``shape`` (the message lists ``SPIKE_SHAPES``).
    """
    return Spike(base, peak, start, width, shape)


def from_trace(times: np.ndarray, bin_s: float, scale: float = 1.0, repeat: bool = False) -> Step:
    """The empirical rate of recorded arrival times: ``scale`` times their count per bin.

    Time is taken relative to ``times[0]``; bin ``k`` covers ``[k * bin_s, (k + 1) * bin_s)``
    and has rate ``scale * count_k / bin_s``, so ``cumulative`` at bin edges is ``scale`` times
    the trace's cumulative counts. The last bin extends past the last arrival (its rate reads
    low by the part it does not cover). Past the last bin: see ``Step`` (``repeat``).

    Raises:
        ValueError: ``times`` empty, not 1-d, not finite or decreasing; ``bin_s`` or ``scale``
            not a finite number > 0.
    """
    rel = _relative_times(times)
    _check_real(bin_s, "bin_s", strict=True)
    _check_real(scale, "scale", strict=True)
    counts = np.bincount((rel // bin_s).astype(np.int64))
    return Step(scale * counts / bin_s, np.full(len(counts), float(bin_s)), repeat)


def arrivals(pattern: RatePattern, duration: float, rng: np.random.Generator) -> np.ndarray:
    """A non-homogeneous Poisson process with intensity ``pattern.rate`` on ``[0, duration)``.

    Lewis–Shedler thinning: candidates at exponential gaps of mean ``1 / max_rate``, each kept
    with probability ``rate(t) / max_rate``; drawn in vectorised chunks (about one chunk for
    ``max_rate * duration`` up to 10^6 candidates). The count in ``[a, b)`` is Poisson with mean
    ``pattern.cumulative(b) - pattern.cumulative(a)``. The same ``rng`` state gives the same
    array. Returns sorted float64 times in seconds, possibly empty; the first need not be 0.

    Raises:
        ValueError: ``pattern`` not a RatePattern, or its ``rate`` above its ``max_rate`` at a
            candidate; ``duration`` not a finite number > 0; ``rng`` not a Generator.
    """
    if not isinstance(pattern, RatePattern):
        raise ValueError(f"pattern must be a RatePattern, got {type(pattern).__name__}")
    _check_real(duration, "duration", strict=True)
    _check_rng(rng)
    top = pattern.max_rate
    if not (math.isfinite(top) and top > 0):
        raise ValueError(f"pattern.max_rate must be a finite number > 0, got {top!r}")
    expected = top * duration
    chunk = int(min(expected + 5 * math.sqrt(expected) + 16, _MAX_CHUNK))
    kept: list[np.ndarray] = []
    last = 0.0
    while last < duration:
        candidates = last + np.cumsum(rng.exponential(1.0 / top, size=chunk))
        last = float(candidates[-1])
        candidates = candidates[candidates < duration]
        rates = np.asarray(pattern.rate(candidates))
        if np.any(rates > top):
            bad = float(candidates[np.argmax(rates > top)])
            raise ValueError(f"pattern.rate exceeds pattern.max_rate={top!r} at t={bad!r}")
        kept.append(candidates[rng.random(len(candidates)) * top < rates])
    return np.concatenate(kept)


def rescale_trace(
    times: np.ndarray, target: float | RatePattern, bin_s: float = 60.0
) -> np.ndarray:
    """Replay recorded arrival times on a new time axis, keeping the trace's burstiness.

    - ``target`` a number (requests/s): time is scaled uniformly so the mean rate
      ``(n - 1) / span`` is ``target``; the trace's whole shape over time is kept.
    - ``target`` a RatePattern: the trace's own rate at the ``bin_s`` scale is replaced by the
      pattern's, keeping its burstiness within bins. The i-th arrival goes where
      ``target.cumulative`` reaches the trace's smoothed count at it (its count at each bin
      edge, linear within a bin; the last bin ends at the last arrival, whose count is ``n``),
      so at any time the count so far is within one trace bin's count of
      ``target.cumulative``. All ``n`` arrivals are placed; cut with ``cut_window``.

    Returns sorted float64 seconds with the first arrival at 0.

    Raises:
        ValueError: ``times`` empty, not 1-d, not finite or decreasing; a number ``target`` not
            finite and > 0; a trace of one instant (no span to rescale); ``bin_s`` not > 0;
            a pattern whose cumulative count never reaches ``n``.
    """
    rel = _relative_times(times)
    _check_real(bin_s, "bin_s", strict=True)
    if not isinstance(target, RatePattern):
        _check_real(target, "target", strict=True)
    if rel[-1] <= 0:
        raise ValueError("times must span more than one instant to be rescaled")
    if isinstance(target, RatePattern):
        return _inverse_cumulative(target, _smoothed_counts(rel, bin_s))
    return rel * ((len(rel) - 1) / rel[-1] / target)


def cut_window(times: np.ndarray, start: float, end: float) -> np.ndarray:
    """The arrival times in ``[start, end)``, shifted so ``start`` becomes 0 (a new array).

    Raises:
        ValueError: ``times`` not 1-d, not finite or decreasing; ``start`` not finite and
            >= 0; ``end`` not finite and > ``start``.
    """
    ts = _sorted_times(times, allow_empty=True)
    _check_real(start, "start", strict=False)
    _check_real(end, "end", strict=True)
    if end <= start:
        raise ValueError(f"end must be > start={start!r}, got {end!r}")
    lo, hi = np.searchsorted(ts, [start, end], side="left")
    return ts[lo:hi] - start


def _inverse_cumulative(pattern: RatePattern, counts: np.ndarray) -> np.ndarray:
    """The least ``t`` with ``pattern.cumulative(t) >= counts`` (to float precision), by
    vectorised bisection."""
    need = float(counts.max(initial=0.0))
    hi = max(need / pattern.max_rate, 1.0)
    for _ in range(64):
        if pattern.cumulative(hi) >= need:
            break
        hi *= 2
    else:
        raise ValueError(f"target's cumulative count never reaches {need:.0f} (its rate ends at 0)")
    lo_t = np.zeros_like(counts)
    hi_t = np.full_like(counts, hi)
    for _ in range(64):
        mid = 0.5 * (lo_t + hi_t)
        below = np.asarray(pattern.cumulative(mid)) < counts
        lo_t = np.where(below, mid, lo_t)
        hi_t = np.where(below, hi_t, mid)
    return np.where(counts > 0, hi_t, 0.0)


def _smoothed_counts(rel: np.ndarray, bin_s: float) -> np.ndarray:
    """Per arrival, the trace's count at the bin edges around it, interpolated linearly."""
    grid = np.arange(0.0, rel[-1], bin_s)
    edges = np.append(grid[grid < rel[-1]], rel[-1])  # the last bin ends at the last arrival
    at_edges = np.concatenate(([0.0], np.cumsum(np.histogram(rel, edges)[0])))
    return np.interp(rel, edges, at_edges)


def _relative_times(times: np.ndarray) -> np.ndarray:
    ts = _sorted_times(times, allow_empty=False)
    return ts - ts[0]


def _sorted_times(times: np.ndarray, allow_empty: bool) -> np.ndarray:
    ts = np.asarray(times, dtype=np.float64)
    if ts.ndim != 1 or (len(ts) == 0 and not allow_empty):
        raise ValueError(f"times must be a {'' if allow_empty else 'non-empty '}1-d array")
    if not np.all(np.isfinite(ts)):
        raise ValueError("times must be finite")
    if np.any(np.diff(ts) < 0):
        first = int(np.argmax(np.diff(ts) < 0)) + 1
        raise ValueError(f"times must be non-decreasing (first decrease at index {first})")
    return ts


def _read_only(a: np.ndarray, name: str) -> np.ndarray:
    if a.ndim != 1 or len(a) == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a non-empty 1-d sequence of finite numbers")
    a = a.copy()
    a.flags.writeable = False
    return a


def _check_real(x: object, name: str, strict: bool) -> None:
    """``x`` a finite real number (not a bool), > 0 if ``strict`` else >= 0."""
    ok = isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)
    if not ok or (x <= 0 if strict else x < 0):  # type: ignore[operator]
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {x!r}")


def _like(t: float | np.ndarray, values: np.ndarray) -> float | np.ndarray:
    return values if np.ndim(t) else float(values)
