"""How good a predictor is on labelled requests: pure functions, no plotting, no files.

Point estimates are medians (what minimises absolute error). Coverage at level ``q`` is the
share of cases whose truth is <= the predicted ``q``-quantile: a calibrated predictor's coverage
curve is the diagonal.

Remaining length is measured at every ``step``-th generated token ``g = 0, step, ... < true``
of every request, i.e. a long request contributes more points (as it does to a scheduler's
decisions); the truth at ``g`` is ``true - g``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

from horizon.prediction import LengthDistribution
from horizon.request import Request

G_BINS: tuple[int, ...] = (0, 16, 64, 128, 256, 384, 512, 768, 1024)


@dataclass(frozen=True)
class Scores:
    """Accuracy of predictions against truths (``n`` cases)."""

    n: int
    mae: float
    spearman: float
    levels: tuple[float, ...]
    coverage: tuple[float, ...]  # per level

    def coverage_at(self, q: float) -> float:
        return self.coverage[self.levels.index(q)]

    def as_dict(self, prefix: str) -> dict:
        out = {
            f"{prefix}_mae": self.mae,
            f"{prefix}_spearman": self.spearman,
            f"{prefix}_n": self.n,
        }
        out[f"{prefix}_coverage"] = dict(zip(map(str, self.levels), self.coverage, strict=True))
        return out


def score(dists: Sequence[LengthDistribution], truths: Sequence[float]) -> Scores:
    """MAE of the medians, Spearman rank correlation of medians vs truths, coverage per level.

    All distributions must share their levels. Spearman is NaN when either side is constant.
    """
    if not dists:
        raise ValueError("score: no predictions")
    levels = dists[0].levels
    q = np.asarray([d.values for d in dists], dtype=np.float64)
    med = np.asarray([d.median for d in dists], dtype=np.float64)
    y = np.asarray(truths, dtype=np.float64)
    rho = float("nan")
    if np.ptp(med) > 0 and np.ptp(y) > 0:
        rho = float(spearmanr(med, y).statistic)
    cov = (y[:, None] <= q).mean(0)
    return Scores(
        n=len(y),
        mae=float(np.abs(med - y).mean()),
        spearman=rho,
        levels=tuple(levels),
        coverage=tuple(float(c) for c in cov),
    )


def remaining_cases(
    predictor, requests: Sequence[Request], step: int = 16
) -> tuple[list[LengthDistribution], np.ndarray, np.ndarray]:
    """``update(r, g)`` at ``g = 0, step, ... < r.true_output_tokens`` of every request.

    Returns ``(distributions, truths, g)``, one entry per point. Call ``prepare`` first if the
    predictor keeps a memo.
    """
    dists: list[LengthDistribution] = []
    truth: list[int] = []
    gs: list[int] = []
    for r in requests:
        t = r.true_output_tokens
        for g in range(0, t, step):
            dists.append(predictor.update(r, g))
            truth.append(t - g)
            gs.append(g)
    return dists, np.asarray(truth, dtype=np.float64), np.asarray(gs, dtype=np.int64)


def mae_by_progress(
    dists: Sequence[LengthDistribution], truths: np.ndarray, g: np.ndarray
) -> list[dict]:
    """MAE of the medians per bin of generated tokens (``G_BINS``; the last bin is open)."""
    med = np.asarray([d.median for d in dists], dtype=np.float64)
    err = np.abs(med - truths)
    rows = []
    edges = (*G_BINS, np.inf)
    for lo, hi in zip(edges, edges[1:]):
        sel = (g >= lo) & (g < hi)
        if sel.any():
            rows.append({"g_lo": int(lo), "g_hi": None if hi == np.inf else int(hi),
                         "n": int(sel.sum()), "mae": float(err[sel].mean())})  # fmt: skip
    return rows
