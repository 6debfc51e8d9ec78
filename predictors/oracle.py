"""Oracles: they read ``true_output_tokens`` (``reads_true_length = True``), as upper bounds."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from horizon.prediction import LengthDistribution
from horizon.request import Request
from predictors.base import LEVELS, BasePredictor, check_generated, clipped, point_mass

_Z = tuple(NormalDist().inv_cdf(q) for q in LEVELS)


class OraclePredictor(BasePredictor):
    """The true length as a point mass; remaining = true - generated (at least 1)."""

    name = "oracle"
    reads_true_length = True

    def predict(self, request: Request) -> LengthDistribution:
        return point_mass(request.true_output_tokens)

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        check_generated(request, tokens_so_far)
        return point_mass(max(request.true_output_tokens - tokens_so_far, 1))


class NoisyOraclePredictor(BasePredictor):
    """The true length with log-normal multiplicative noise, times a safety margin.

    A request's estimate is ``true * exp(sigma * e) * margin`` with ``e ~ N(0, 1)`` drawn from
    a generator seeded by ``(seed, request_id)``: the same request always gets the same noise,
    whatever else ran before (no shared random state). The distribution around it is the
    log-normal of the same ``sigma`` (quantile q at ``estimate * exp(sigma * z_q)``), i.e. an
    honest statement of the noise; ``sigma = 0`` gives a point mass. Values are clipped to
    ``[1, max_output_tokens]``. ``update`` conditions it on the tokens generated so far.
    """

    name = "noisy_oracle"
    reads_true_length = True

    def __init__(self, sigma: float = 0.5, margin: float = 1.0, seed: int = 0) -> None:
        if not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
            raise ValueError(f"noisy_oracle: sigma must be a finite number >= 0, got {sigma!r}")
        if not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
            raise ValueError(f"noisy_oracle: margin must be a finite number > 0, got {margin!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"noisy_oracle: seed must be an int >= 0, got {seed!r}")
        self.sigma = float(sigma)
        self.margin = float(margin)
        self.seed = seed

    def noise(self, request: Request) -> float:
        """The request's standard-normal draw (a pure function of ``seed`` and its id)."""
        rid = request.request_id
        key = [self.seed, rid] if rid >= 0 else [self.seed, 1, -rid]
        return float(np.random.default_rng(key).standard_normal())

    def estimate(self, request: Request) -> float:
        """The noisy point estimate, before clipping."""
        return request.true_output_tokens * math.exp(self.sigma * self.noise(request)) * self.margin

    def predict(self, request: Request) -> LengthDistribution:
        hi = float(request.max_output_tokens)
        center = self.estimate(request)
        if self.sigma == 0:
            return point_mass(min(center, hi))
        vals = clipped([center * math.exp(self.sigma * z) for z in _Z], hi)
        return LengthDistribution(LEVELS, vals, 1.0, hi)

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        check_generated(request, tokens_so_far)
        return self.predict(request).remaining(tokens_so_far)
