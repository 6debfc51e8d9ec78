"""expected_use: the summed expected pool use equals the direct per-request sum."""

from __future__ import annotations

import numpy as np
import pytest

from horizon.policies.expected_use import expected_use
from horizon.prediction import LengthDistribution


def _direct(tau, dists, tokens, half):  # noqa: ANN001, ANN202 - the definition, one by one
    out = np.zeros(len(tau))
    for d, n in zip(dists, tokens):
        xs, fs = d.knots()
        head = tau[: int(np.searchsorted(tau, xs[-1], side="right"))]
        out[: len(head)] += (n + head + half) * (1.0 - np.interp(head, xs, fs))
    return out


def _random_dists(rng: np.random.Generator, n: int) -> list[LengthDistribution]:
    levels = tuple(float(q) for q in np.arange(0.05, 1.0, 0.05))
    out = []
    for _ in range(n):
        kind = rng.integers(4)
        if kind == 0:  # a point mass (an oracle's prediction)
            t = float(rng.integers(1, 3000))
            out.append(LengthDistribution((0.5,), (t,), t, t))
            continue
        vals = np.sort(rng.lognormal(5, 1, len(levels)))
        vals = np.maximum.accumulate(np.maximum(vals, 1.0))
        hi = float(vals[-1] * 1.5) if kind == 1 else np.inf
        d = LengthDistribution(levels, tuple(float(v) for v in vals), 1.0, hi)
        out.append(d.remaining(int(rng.integers(0, 400))) if kind == 3 else d)
    return out


@pytest.mark.parametrize("grid_step", [1, 4])
def test_expected_use_equals_the_direct_sum(grid_step):
    rng = np.random.default_rng(grid_step)
    tau = np.arange(0, 4096 + 1, grid_step, dtype=np.float64)
    dists = _random_dists(rng, 300)
    tokens = rng.integers(1, 4000, len(dists)).astype(float)
    got = expected_use(tau, dists, tokens, 8.0)
    want = _direct(tau, dists, tokens, 8.0)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    assert want[0] > 0 and want.max() > 1e5  # the comparison is not of near-empty curves


def test_expected_use_of_nothing_and_of_one_exact_request():
    tau = np.arange(0, 65, dtype=np.float64)
    assert not expected_use(tau, [], [], 8.0).any()
    point = LengthDistribution((0.5,), (10.0,), 10.0, 10.0)  # ends after exactly 10 more steps
    got = expected_use(tau, [point], [100.0], 8.0)
    np.testing.assert_allclose(got[:10], 108.0 + tau[:10])
    assert not got[10:].any()
