"""Calibrating the remaining-length distribution as a function of progress.

A total-length distribution ``F`` turns into a remaining-length one by conditioning on
``total > g`` (``LengthDistribution.remaining``): the remaining quantile at level ``q`` is
``F^-1(F(g) + q (1 - F(g))) - g``. That is right only if ``F``'s *tail* is right, which a model
fitted to totals does not promise. So we measure it: on held-out requests, at every ``step``-th
generated token ``g < true``, the truth's position inside the conditional distribution,

    u = (F(true) - F(g)) / (1 - F(g))            (uniform on [0, 1] if F's tail is right),

and replace ``q`` by the empirical ``q``-quantile of ``u`` among held-out points in the same cell
of a (``F(g)``, ``g``) grid. ``F(g)`` says how deep into its predicted tail a request is; ``g``
carries what is common to all requests at that length (ShareGPT replies rarely pass ~900 tokens).
Sparse cells are shrunk towards their ``F(g)`` row. At ``g = 0`` nothing changes.

The online path (``RemainingCalibrator.remaining``) is pure Python over precomputed lists:
two ``bisect`` lookups for the cell and one per level, a few microseconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from horizon.prediction import LengthDistribution

F_EDGES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
G_EDGES: tuple[float, ...] = (1, 32, 64, 128, 256, 384, 512, 768, 1024)
SHRINK_POINTS = 200  # a cell with n points gets weight n / (n + SHRINK_POINTS) against its row


def knots(quantiles: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """CDF knot positions per row: ``[1, q_1, ..., q_L, hi]`` (see ``LengthDistribution``)."""
    n = len(quantiles)
    return np.concatenate([np.ones((n, 1)), quantiles, np.asarray(hi, float).reshape(n, 1)], 1)


def cdf_rows(xs: np.ndarray, fs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Row-wise piecewise-linear CDF: ``F_i(x_i)`` for knots ``xs[i]`` at levels ``fs``."""
    x = np.asarray(x, dtype=np.float64)
    k = np.clip((xs <= x[:, None]).sum(1), 1, xs.shape[1] - 1)  # xs[k-1] <= x < xs[k]
    r = np.arange(len(xs))
    x0, x1 = xs[r, k - 1], xs[r, k]
    w = np.where(x1 > x0, (x - x0) / np.where(x1 > x0, x1 - x0, 1.0), 1.0)
    f = fs[k - 1] + (fs[k] - fs[k - 1]) * np.clip(w, 0.0, 1.0)
    return np.where(x < xs[:, 0], 0.0, np.where(x >= xs[:, -1], 1.0, f))


def quantile_rows(xs: np.ndarray, fs: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Row-wise inverse of ``cdf_rows``: the ``p_i``-quantile of row ``i``."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    k = np.clip(np.searchsorted(fs, p, side="left"), 1, len(fs) - 1)  # fs[k-1] < p <= fs[k]
    r = np.arange(len(xs))
    f0, f1 = fs[k - 1], fs[k]
    return xs[r, k - 1] + (xs[r, k] - xs[r, k - 1]) * (p - f0) / (f1 - f0)


def progress_points(totals: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, g)`` for every ``g = 0, step, 2 step, ... < totals[row]``."""
    totals = np.asarray(totals, dtype=np.int64)
    counts = (totals + step - 1) // step
    rows = np.repeat(np.arange(len(totals)), counts)
    starts = np.cumsum(counts) - counts
    g = (np.arange(counts.sum()) - np.repeat(starts, counts)) * step
    return rows, g.astype(np.float64)


@dataclass(frozen=True)
class RemainingCalibrator:
    """Per-cell quantiles of ``u`` (module docstring); ``table[f_bin][g_bin][level]``."""

    levels: tuple[float, ...]
    f_edges: tuple[float, ...]
    g_edges: tuple[float, ...]
    table: tuple[tuple[tuple[float, ...], ...], ...]
    counts: tuple[tuple[int, ...], ...]

    @classmethod
    def fit(
        cls,
        levels: Sequence[float],
        quantiles: np.ndarray,
        hi: np.ndarray,
        totals: np.ndarray,
        step: int = 16,
    ) -> RemainingCalibrator:
        """From held-out predictions ``quantiles`` (n x levels), supports' ``hi`` and truths."""
        fs = np.asarray([0.0, *levels, 1.0])
        xs = knots(np.asarray(quantiles, np.float64), hi)
        rows, g = progress_points(totals, step)
        keep = g >= G_EDGES[0]
        rows, g = rows[keep], g[keep]
        xr = xs[rows]
        fg = cdf_rows(xr, fs, g)
        ft = cdf_rows(xr, fs, np.asarray(totals, np.float64)[rows])
        u = np.clip((ft - fg) / np.maximum(1.0 - fg, 1e-12), 0.0, 1.0)
        fb = np.searchsorted(F_EDGES, fg, side="right") - 1
        gb = np.searchsorted(G_EDGES, g, side="right") - 1
        lv = np.asarray(levels)
        table, counts = [], []
        for i in range(len(F_EDGES)):
            in_row = fb == i
            row_q = np.quantile(u[in_row], lv) if in_row.sum() >= 20 else lv
            cells, ns = [], []
            for j in range(len(G_EDGES)):
                sel = in_row & (gb == j)
                n = int(sel.sum())
                w = n / (n + SHRINK_POINTS)
                q = w * np.quantile(u[sel], lv) + (1 - w) * row_q if n else row_q
                cells.append(tuple(float(v) for v in np.maximum.accumulate(q)))
                ns.append(n)
            table.append(tuple(cells))
            counts.append(tuple(ns))
        return cls(tuple(levels), F_EDGES, G_EDGES, tuple(table), tuple(counts))

    def level_map(self, f: float, g: float) -> tuple[float, ...]:
        """The corrected ``u`` per level for a request at ``F(g) = f`` after ``g`` tokens."""
        i = max(bisect.bisect_right(self.f_edges, f) - 1, 0)
        j = max(bisect.bisect_right(self.g_edges, g) - 1, 0)
        return self.table[i][j]

    def remaining(
        self, xs: Sequence[float], fs: Sequence[float], g: int
    ) -> LengthDistribution | None:
        """Calibrated remaining distribution after ``g >= 1`` tokens, for a total distribution
        with CDF knots ``xs`` (``[lo, values..., hi]``) at ``fs`` (``[0, levels..., 1]``).

        Returns None when ``g`` is at or past the support's end (the caller decides).
        """
        hi = xs[-1]
        if g >= hi:
            return None
        k = bisect.bisect_right(xs, g)
        if k == 0:
            f = 0.0
        else:
            x0, x1 = xs[k - 1], xs[k]
            f = fs[k] if x1 <= x0 else fs[k - 1] + (fs[k] - fs[k - 1]) * (g - x0) / (x1 - x0)
        rest = 1.0 - f
        vals = []
        top = 1.0
        last = len(fs) - 1
        for u in self.level_map(f, g):
            p = f + u * rest
            m = bisect.bisect_left(fs, p)
            m = 1 if m < 1 else last if m > last else m
            f0 = fs[m - 1]
            x0 = xs[m - 1]
            v = x0 + (xs[m] - x0) * (p - f0) / (fs[m] - f0) - g
            if v > top:
                top = v
            vals.append(top)
        return LengthDistribution(self.levels, tuple(vals), 1.0, hi - g)
