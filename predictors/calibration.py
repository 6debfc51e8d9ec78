"""Calibrating the remaining-length distribution as a function of progress.

The remaining-length model (``length_model.RemainingModel``) gives, for a request after ``g``
generated tokens, a location ``m`` and a scale ``s`` of ``log(remaining)``. Its quantile at level
``q`` is ``exp(m + s * z_q)``, with ``z_q`` measured, not assumed: on held-out requests, at every
``step``-th generated token ``g < true``, the standardised residual

    z = (log(true - g) - m) / s

is collected, and ``z_q`` is its empirical ``q``-quantile among held-out points in the same band
of ``g`` (``G_EDGES``). The bands matter because the residuals' shape changes with progress
(ShareGPT replies rarely pass ~900 tokens, so far into a reply the tail is short). Sparse bands
are shrunk towards the quantiles of all points. This is split-conformal in spirit: on data like
the calibration split, the coverage at each level is right by construction, per band.

The online path (``ResidualQuantiles.row``) is one ``bisect`` over a tuple of band edges.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

G_EDGES: tuple[float, ...] = (1, 32, 64, 128, 256, 384, 512, 768, 1024)
SHRINK_POINTS = 200  # a band with n points gets weight n / (n + SHRINK_POINTS) against all points


def progress_points(totals: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, g)`` for every ``g = 0, step, 2 step, ... < totals[row]``."""
    totals = np.asarray(totals, dtype=np.int64)
    counts = (totals + step - 1) // step
    rows = np.repeat(np.arange(len(totals)), counts)
    starts = np.cumsum(counts) - counts
    g = (np.arange(counts.sum()) - np.repeat(starts, counts)) * step
    return rows, g.astype(np.float64)


@dataclass(frozen=True)
class ResidualQuantiles:
    """Per-band quantiles of standardised residuals (module docstring); ``table[band][level]``,
    non-decreasing along levels."""

    levels: tuple[float, ...]
    g_edges: tuple[float, ...]
    table: tuple[tuple[float, ...], ...]
    counts: tuple[int, ...]

    @classmethod
    def fit(
        cls, levels: Sequence[float], z: np.ndarray, g: np.ndarray, edges: Sequence[float] = G_EDGES
    ) -> ResidualQuantiles:
        """From held-out standardised residuals ``z`` at progress ``g >= edges[0]``."""
        z, g = np.asarray(z, dtype=np.float64), np.asarray(g, dtype=np.float64)
        if len(z) == 0:
            raise ValueError("ResidualQuantiles.fit: no held-out points")
        lv = np.asarray(levels, dtype=np.float64)
        every = np.quantile(z, lv)
        band = np.searchsorted(edges, g, side="right") - 1
        table, counts = [], []
        for j in range(len(edges)):
            sel = band == j
            n = int(sel.sum())
            w = n / (n + SHRINK_POINTS)
            q = w * np.quantile(z[sel], lv) + (1 - w) * every if n else every
            table.append(tuple(float(v) for v in np.maximum.accumulate(q)))
            counts.append(n)
        return cls(tuple(levels), tuple(float(e) for e in edges), tuple(table), tuple(counts))

    def row(self, g: float) -> tuple[float, ...]:
        """The ``z_q`` per level after ``g`` generated tokens."""
        return self.table[max(bisect.bisect_right(self.g_edges, g) - 1, 0)]

    def rows(self, g: np.ndarray) -> np.ndarray:
        """``row`` for many ``g`` at once: an array (len(g) x levels)."""
        band = np.clip(np.searchsorted(self.g_edges, g, side="right") - 1, 0, None)
        return np.asarray(self.table)[band]
