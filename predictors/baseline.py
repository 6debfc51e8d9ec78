"""``prompt_length``: output length from prompt length alone, carried forward while decoding.

This is the baseline the learned predictor is measured against: what a server can do with the
one number it always has. Training prompts are cut into ``bins`` equal-count prompt-length bins;
a request gets its bin's empirical output quantiles. Its online estimate does *not* condition on
progress: every quantile minus the tokens generated, floored at 1 (``carried_forward``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from horizon.prediction import LengthDistribution
from horizon.request import Request
from predictors.base import LEVELS, BasePredictor, carried_forward, check_generated, clipped


class PromptLengthBaseline(BasePredictor):
    """Per prompt-length bin output quantiles; remaining = max(quantile - generated, 1)."""

    name = "prompt_length"
    reads_true_length = False
    learns = True

    def __init__(self, bins: int = 10) -> None:
        if not isinstance(bins, int) or bins < 1:
            raise ValueError(f"prompt_length: bins must be an int >= 1, got {bins!r}")
        self.bins = bins
        self.edges: list[float] | None = None  # upper prompt-length edges of all but the last bin
        self.table: list[tuple[float, ...]] | None = None

    def fit(self, requests: Sequence[Request], data: dict | None = None) -> PromptLengthBaseline:
        if len(requests) < self.bins:
            raise ValueError(f"prompt_length: fit needs >= {self.bins} requests")
        p = np.asarray([r.num_prompt_tokens for r in requests], dtype=np.float64)
        y = np.asarray([r.true_output_tokens for r in requests], dtype=np.float64)
        edges = np.unique(np.quantile(p, np.linspace(0, 1, self.bins + 1)[1:-1]))
        which = np.searchsorted(edges, p, side="left")
        table = []
        for b in range(len(edges) + 1):
            sel = y[which == b]
            table.append(tuple(float(v) for v in np.quantile(sel if len(sel) else y, LEVELS)))
        self.edges, self.table = edges.tolist(), table
        return self

    def predict(self, request: Request) -> LengthDistribution:
        if self.edges is None or self.table is None:
            raise ValueError("prompt_length: call fit(requests) before predict")
        b = bisect.bisect_left(self.edges, request.num_prompt_tokens)
        hi = float(request.max_output_tokens)
        return LengthDistribution(LEVELS, clipped(self.table[b], hi), 1.0, hi)

    def update(self, request: Request, tokens_so_far: int) -> LengthDistribution:
        check_generated(request, tokens_so_far)
        return carried_forward(self.predict(request), tokens_so_far)
