"""Fitting ``TensorParallelCostModel``'s coefficients to measured tensor-parallel steps.

Each measured step (a ``TP_STEP_COLUMNS`` row: its world size, then the engine's
``STEP_COLUMNS``) gives the model's unscaled terms at its world: the rank's roofline, the
all-reduces' latency and their bandwidth time, and 1 (the step overhead). The coefficients
are the non-negative least squares of those terms against the measured seconds, each step
weighted by 1 / seconds (relative error). Steps of one world size cannot tell the
all-reduce latency from the overhead (both are the same constant there), so the rows must
hold at least two: TP=1 steps of the same engine pin the overhead and the rank's scale.

Rows from engine records: ``with_world(step_rows(records), world)``.
"""

from __future__ import annotations

import numpy as np

from horizon.model_shape import ModelShape
from simulator.engine_cost_model import STEP_COLUMNS
from simulator.gpu import GpuSpec

MIN_STEPS = 8


def with_world(rows: np.ndarray, world: int) -> np.ndarray:
    """``STEP_COLUMNS`` rows of a run at tensor-parallel size ``world`` as
    ``TP_STEP_COLUMNS`` rows."""
    if rows.ndim != 2 or rows.shape[1] != len(STEP_COLUMNS):
        raise ValueError(f"with_world: rows must have the {len(STEP_COLUMNS)} STEP_COLUMNS")
    return np.c_[np.full(len(rows), float(world)), rows]


def term_matrix(cls: type, rows: np.ndarray, shape: ModelShape, gpu: GpuSpec, **kw) -> np.ndarray:  # noqa: ANN401
    """``[steps, 4]``: each row's unscaled terms (rank roofline, all-reduce latency, all-reduce
    bytes time, 1) at its own world, the model ``cls(shape, gpu, world, **kw)``'s."""
    out = np.ones((len(rows), 4))
    for w in np.unique(rows[:, 0]):
        model = cls(shape, gpu, int(w), **kw)
        at = np.flatnonzero(rows[:, 0] == w)
        out[at, :3] = [model.terms(*(int(v) for v in rows[i, 1:7])) for i in at]
    return out


def fit_coefficients(
    cls: type, rows: np.ndarray, shape: ModelShape, gpu: GpuSpec, **kw
) -> tuple[dict[str, float], list[int]]:
    """(``COEFFICIENTS`` by name, the world sizes seen) fitted to ``TP_STEP_COLUMNS`` rows (see
    the module docstring). Raises ValueError for too few steps or world sizes."""
    from scipy.optimize import nnls  # only when fitting

    from simulator.tp_cost_model import COEFFICIENTS, TP_STEP_COLUMNS

    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != len(TP_STEP_COLUMNS):
        raise ValueError(f"TP fit: rows must have the {len(TP_STEP_COLUMNS)} TP_STEP_COLUMNS")
    rows = rows[(rows[:, 1] + rows[:, 2]) > 0]
    worlds = sorted({int(w) for w in rows[:, 0]})
    if len(rows) < MIN_STEPS:
        raise ValueError(f"TP fit needs >= {MIN_STEPS} steps with a token, got {len(rows)}")
    if len(worlds) < 2:
        raise ValueError(
            f"TP fit needs steps of >= 2 world sizes (e.g. TP=1 and TP=2), got {worlds}: with "
            "one, the all-reduce latency and the step overhead are the same constant"
        )
    x = term_matrix(cls, rows, shape, gpu, **kw)
    y = rows[:, -1]
    if not (y > 0).all():
        raise ValueError("TP fit: every step_s must be > 0")
    coef = nnls(x / y[:, None], np.ones(len(y)))[0]
    return dict(zip(COEFFICIENTS, (float(c) for c in coef))), worlds
