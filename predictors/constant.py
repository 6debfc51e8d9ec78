"""``mean``: one distribution for every request, the training outputs' empirical quantiles."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from horizon.prediction import LengthDistribution
from horizon.request import Request
from predictors.base import LEVELS, BasePredictor, clipped


class MeanPredictor(BasePredictor):
    """Constant prediction: the quantiles of ``true_output_tokens`` over the ``fit`` requests.

    Reads true lengths only in ``fit`` (training labels), never in ``predict``. ``update``
    conditions the constant distribution on the tokens generated so far.
    """

    name = "mean"
    reads_true_length = False
    learns = True

    def __init__(self) -> None:
        self.quantiles: tuple[float, ...] | None = None

    def fit(self, requests: Sequence[Request], data: dict | None = None) -> MeanPredictor:
        if not requests:
            raise ValueError("mean: fit needs at least one request")
        y = np.asarray([r.true_output_tokens for r in requests], dtype=np.float64)
        self.quantiles = tuple(float(v) for v in np.quantile(y, LEVELS))
        return self

    def predict(self, request: Request) -> LengthDistribution:
        if self.quantiles is None:
            raise ValueError("mean: call fit(requests) before predict")
        hi = float(request.max_output_tokens)
        return LengthDistribution(LEVELS, clipped(self.quantiles, hi), 1.0, hi)
