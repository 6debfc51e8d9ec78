"""The pool's expected use ahead, summed over many requests at once (Horizon's refresh).

Request ``i`` holds ``n_i`` tokens now, grows one token per step and frees them all when it
ends; with ``S_i(tau) = P(remaining_i > tau)`` from its ``LengthDistribution`` (a
piecewise-linear CDF), it holds ``(n_i + h + tau) * S_i(tau)`` tokens in expectation ``tau``
steps ahead (``h``: half a block of rounding). ``expected_use`` returns the sum over requests
on a grid of ``tau``.

Between two knots ``S_i`` is linear in ``tau``, so each request's term is a quadratic
``A + B tau + C tau^2`` on each knot interval. The coefficients are added where an interval
starts and subtracted where it ends (difference arrays), and one cumulative sum per
coefficient gives every grid point: O(knots) per request plus O(grid) once, instead of
O(grid) per request. The values equal the per-request sum up to rounding (about 1e-12
relative; ``tests/test_expected_use.py`` checks it against the direct sum).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizon.prediction import LengthDistribution


def expected_use(
    tau: np.ndarray, dists: Sequence[LengthDistribution], tokens: Sequence[float], half: float
) -> np.ndarray:
    """``sum_i (tokens[i] + half + tau) * P(remaining_i > tau)`` at each point of ``tau`` (a
    non-negative, increasing grid starting at 0), where ``dists[i]`` is request ``i``'s
    remaining-length distribution; 0 past each distribution's support."""
    out = np.zeros(len(tau))
    if not dists:
        return out
    knots = [d.knots() for d in dists]
    k = max(len(xs) for xs, _ in knots)
    x = np.empty((len(dists), k))
    f = np.empty((len(dists), k))
    for i, (xs, fs) in enumerate(knots):  # pad with the last knot: empty intervals
        n = len(xs)
        x[i, :n], f[i, :n] = xs, fs
        x[i, n:], f[i, n:] = xs[-1], fs[-1]
    a = np.asarray(tokens, dtype=np.float64) + half
    # intervals: [0, x0) where S = 1 - f0, then [x_j, x_j+1) where S = 1 - f_j - m_j (tau - x_j)
    lo = np.concatenate([np.zeros((len(dists), 1)), x[:, :-1]], axis=1)
    hi = x
    dx = np.diff(x, axis=1)
    slope = np.zeros_like(x)
    np.divide(np.diff(f, axis=1), dx, out=slope[:, 1:], where=dx > 0)
    f_lo = np.concatenate([f[:, :1], f[:, :-1]], axis=1)
    p = 1.0 - f_lo + slope * lo  # S(tau) = p + q * tau on the interval
    q = -slope
    start = np.searchsorted(tau, lo.ravel(), side="left")
    end = np.searchsorted(tau, hi.ravel(), side="left")
    coef = (a[:, None] * p, a[:, None] * q + p, q)  # (a + tau)(p + q tau) = A + B tau + C tau^2
    width = len(tau) + 1
    acc = []
    for c in coef:
        d = np.zeros(width)
        c = c.ravel()
        np.add.at(d, start, c)
        np.add.at(d, end, -c)
        acc.append(np.cumsum(d)[:-1])
    out = acc[0] + acc[1] * tau + acc[2] * tau * tau
    # the direct sum counts a request up to its support's end inclusive, where S = 1 - F = 0
    return np.maximum(out, 0.0)
