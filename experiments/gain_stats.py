"""Means over seeds with 95% confidence intervals, as the headline reports them.

The interval is Student's t over seeds: ``mean ± t(0.975, n-1) · sd / sqrt(n)`` (sd with
``n - 1``). Seeds are independent draws of the requests and their arrivals, so a seed is the
unit of replication; with one seed the interval is the point itself. A ratio of two policies is
taken per seed (the same requests under both) and its interval is the t interval of those
paired ratios.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

LEVEL = 0.95


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lo, hi) of ``values`` (at least one)."""
    if not values:
        raise ValueError("mean_ci: no values")
    n = len(values)
    m = math.fsum(values) / n
    if n == 1:
        return m, m, m
    sd = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n)
    return m, m - half, m + half


def paired_ratio_ci(num: Sequence[float], den: Sequence[float]) -> tuple[float, float, float]:
    """(mean, lo, hi) of the per-seed ratios ``num[i] / den[i]``; None-free, den > 0."""
    if len(num) != len(den):
        raise ValueError(f"paired_ratio_ci: {len(num)} values against {len(den)}")
    return mean_ci([a / b for a, b in zip(num, den, strict=True)])


def separated(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Whether interval ``a`` lies wholly above interval ``b``."""
    return a[1] > b[2]


def rounded(t: tuple[float, float, float], digits: int = 4) -> dict:
    return {"mean": round(t[0], digits), "ci": [round(t[1], digits), round(t[2], digits)]}
