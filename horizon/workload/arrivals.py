"""Arrival processes: seeded, each returning ``n`` non-decreasing float64 times in seconds.

Synthetic processes put the first arrival at t = 0 and then add ``n - 1`` independent gaps (as
vLLM's benchmark client does: send, then sleep a gap), so their mean rate is
``(n - 1) / times[-1]``. Randomness comes only from the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import math

import numpy as np


def poisson(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean ``1 / rate`` seconds.

    Raises:
        ValueError: ``rate`` not finite and > 0, ``n`` not an int >= 1, ``rng`` not a Generator.
    """
    _check_rate(rate)
    _check_n(n)
    _check_rng(rng)
    return _from_gaps(rng.exponential(1.0 / rate, size=n - 1))


def gamma(rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Gamma-renewal arrivals with mean rate ``rate`` (vLLM's ``--burstiness`` convention).

    Gaps are Gamma(shape=burstiness, scale=1 / (rate * burstiness)): mean ``1 / rate``,
    coefficient of variation ``1 / sqrt(burstiness)``. ``burstiness == 1`` is Poisson; below 1
    is burstier, above 1 more regular.

    Raises:
        ValueError: ``rate`` or ``burstiness`` not finite and > 0, ``n`` not an int >= 1.
    """
    _check_rate(rate)
    if not _finite_positive(burstiness):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness!r}")
    _check_n(n)
    _check_rng(rng)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return _from_gaps(gaps)


def replay(timestamps: np.ndarray, n: int, rate_scale: float = 1.0) -> np.ndarray:
    """Replay a recorded trace's arrival times, ``rate_scale`` times as fast.

    Times are taken relative to the first timestamp and divided by ``rate_scale`` (2 = twice the
    recorded rate). If ``n`` exceeds the trace, it wraps around: each further pass starts one mean
    gap (of the scaled trace) after the previous pass's last arrival.

    Raises:
        ValueError: ``timestamps`` empty, not finite or decreasing; ``rate_scale`` not finite
            and > 0; ``n`` not an int >= 1; ``n`` exceeds a one-element trace (no gap to repeat).
    """
    ts = np.asarray(timestamps, dtype=np.float64)
    if ts.ndim != 1 or len(ts) == 0:
        raise ValueError("timestamps must be a non-empty 1-d array")
    if not np.all(np.isfinite(ts)):
        raise ValueError("timestamps must be finite")
    if np.any(np.diff(ts) < 0):
        raise ValueError(
            f"timestamps must be non-decreasing (first decrease at index "
            f"{int(np.argmax(np.diff(ts) < 0)) + 1})"
        )
    if not _finite_positive(rate_scale):
        raise ValueError(f"rate_scale must be a finite number > 0, got {rate_scale!r}")
    _check_n(n)
    rel = (ts - ts[0]) / rate_scale
    if n <= len(rel):
        return rel[:n].copy()
    if len(rel) == 1:
        raise ValueError(f"cannot replay {n} arrivals from a one-element trace")
    period = rel[-1] + rel[-1] / (len(rel) - 1)  # one pass plus one mean gap
    passes = -(-n // len(rel))
    return (rel[None, :] + period * np.arange(passes)[:, None]).ravel()[:n]


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    times = np.empty(len(gaps) + 1, dtype=np.float64)
    times[0] = 0.0
    np.cumsum(gaps, out=times[1:])
    return times


def _finite_positive(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _check_rate(rate: float) -> None:
    if not _finite_positive(rate):
        raise ValueError(f"rate must be a finite number > 0 (requests/s), got {rate!r}")


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")


def _check_rng(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
