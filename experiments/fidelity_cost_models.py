"""The step cost models the fidelity comparison scores on held-out steps, and two figures of
the engine's own steps: the floor no plan-based model can beat, and the host time that lands
in the step planned before a refresh.

Candidates (``candidates``): the roofline, the linear model fitted to the offline profiler grid
(``FittedCostModel``), the linear model fitted to the calibration cases' online steps
(``EngineCostModel``, the one the simulator uses), and a boosted-tree model on the same features
(sklearn, for comparison only). Each has ``predict_rows(rows) -> seconds``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


class _ByShape:
    """``predict_rows`` for a model with ``time_for(p, d, dctx, pctx, pairs, n)``."""

    def __init__(self, m) -> None:  # noqa: ANN001
        self.m = m

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.array([self.m.time_for(*(int(v) for v in r[:6])) for r in rows])


class _Tree:
    """A boosted-tree model of log step time on the linear model's features."""

    def __init__(self, rows: np.ndarray, buckets) -> None:  # noqa: ANN001
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.buckets = buckets
        self.m = HistGradientBoostingRegressor(
            loss="absolute_error", max_iter=300, random_state=0
        ).fit(self._x(rows), np.log(rows[:, -1]))

    def _x(self, rows: np.ndarray) -> np.ndarray:
        from simulator.engine_cost_model import features

        _, dec, mix = features(rows, self.buckets)
        return np.concatenate([rows[:, :7], dec[:, 1:2], mix[:, 1:2]], axis=1)

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.exp(self.m.predict(self._x(rows)))


def candidates(model: str, cal_rows: np.ndarray, buckets) -> dict:  # noqa: ANN001
    """Name -> cost model, each fitted (where it is fitted) to ``cal_rows``, the calibration
    cases' step rows; the profiler-grid model only where ``calibration/h200_<model>.csv``
    exists."""
    from horizon.model_shape import model_shape
    from simulator.cost_model import RooflineCostModel
    from simulator.engine_cost_model import EngineCostModel
    from simulator.fitted_cost_model import FittedCostModel
    from simulator.gpu import gpu_spec

    out = {
        "roofline": _ByShape(RooflineCostModel(model_shape(model), gpu_spec("H200"))),
        "linear, online steps": EngineCostModel.fit(cal_rows, buckets),
        "tree, online steps": _Tree(cal_rows, buckets),
    }
    grid = REPO / "calibration" / f"h200_{model}.csv"
    if grid.exists():
        out["linear, profiler grid"] = _ByShape(FittedCostModel.from_csv(str(grid)))
    return out


def self_fit_mape(per_run: list[np.ndarray], buckets) -> dict:  # noqa: ANN001
    """The linear form fitted to each run's own steps, scored on them: what no calibration
    can beat, the run's step-time noise around its best linear fit (a floor for held-out MAPE)."""
    from simulator.engine_cost_model import EngineCostModel, mape

    parts = [(mape(EngineCostModel.fit(r, buckets), r), len(r)) for r in per_run]
    total = sum(n for _, n in parts)
    return {k: sum(m[k] * n for m, n in parts) / total for k in ("all", "decode_only", "mixed")} | {
        "steps": int(total)
    }


def pre_refresh(
    refreshed: np.ndarray, rows: np.ndarray, modelled: np.ndarray
) -> tuple[float, float, int] | None:
    """(median measured/modelled time of the decode-only steps planned just before a refresh,
    the same of the other decode-only steps, how many before a refresh), or None for a run
    without refreshes. ``refreshed``: the run's ``num_refreshed``; ``rows``: its step rows;
    ``modelled``: the cost model's time of each. In the pipelined loop a step's tokens are read
    after the next step is planned, so host time spent planning a refresh step lands in the
    step before it."""
    ref = refreshed > 0
    if not ref[1:].any():
        return None
    ratio = rows[:, -1] / modelled
    decode = (rows[:, 0] == 0) & (rows[:, 1] > 0)
    before = np.zeros(len(ref), dtype=bool)
    before[:-1] = ref[1:]
    pre, other = decode & before, decode & ~before & ~ref
    if not pre.any() or not other.any():
        return None
    return float(np.median(ratio[pre])), float(np.median(ratio[other])), int(pre.sum())
