import numpy as np

from simulator.engine_cost_model import Buckets
from simulator.physical_cost_model import PhysicalCostModel, physical_features

TRUE = (4e-3, 6e-3, 2e-6, 1.5e-3, 1e-10, 2e-6, 1e-6, 2e-4)


def _steps(rng, n, ctx_scale=1.0):
    d = rng.integers(1, 200, n).astype(float)
    p = np.where(rng.random(n) < 0.4, rng.integers(1, 1800, n), 0).astype(float)
    dctx = d * rng.integers(100, 1500, n) * ctx_scale
    pctx = np.where(p > 0, rng.integers(0, 2000, n) * ctx_scale, 0)
    pairs = p * (pctx + p / 2)
    chunks = (p > 0).astype(float)
    rows = np.stack(
        [p, d, dctx, pctx, pairs, chunks, rng.integers(0, 5, n), np.zeros(n), np.zeros(n)], 1
    )
    rows[:, -1] = physical_features(rows, Buckets(), 57344) @ np.array(TRUE)
    return rows


def test_fit_recovers_coefficients_and_extrapolates_to_4x_context():
    rng = np.random.default_rng(0)
    m = PhysicalCostModel.fit(_steps(rng, 3000))
    assert np.allclose(m.coef[:5], TRUE[:5], rtol=0.05)
    far = _steps(rng, 500, ctx_scale=4.0)
    err = np.abs(m.predict_rows(far) / far[:, -1] - 1)
    assert err.mean() < 0.01
