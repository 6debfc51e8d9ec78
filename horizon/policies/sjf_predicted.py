"""Shortest predicted output first, with linear aging (``sjf_prompt`` with a predictor's size).

The size of a waiting request is the median of its predicted *remaining* output,
``predictor.update(req, tokens emitted)`` (for a new request, the median of its predicted
total; for one preempted by recompute, of what it has still to emit). Priority:
``size - aging_tokens_per_s * wait``; smaller first. As in ``sjf_prompt`` the order is
time-invariant (``size + rate * arrival``), computed once when the request enters the queue,
and aging bounds every wait: a request arriving ``w`` s earlier beats any predicted up to
``rate * w`` tokens shorter. Ties go to the smaller request id. The victim of a preemption
is the running request last in that order: the largest key it was queued with, the later
admission breaking ties (keys are kept per request, so a preemption asks the predictor
nothing).

Any ``LengthPredictor`` works; the policy reads the true length only through an oracle
predictor, and then says so (``reads_true_length``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from horizon.policies.base import Policy
from horizon.prediction import LengthPredictor
from horizon.request import Request


class SJFPredicted(Policy):
    name = "sjf_predicted"

    def __init__(self, predictor: LengthPredictor, aging_tokens_per_s: float = 100.0) -> None:
        if not math.isfinite(aging_tokens_per_s) or aging_tokens_per_s < 0:
            raise ValueError(
                "sjf_predicted.aging_tokens_per_s must be finite and >= 0, "
                f"got {aging_tokens_per_s!r}"
            )
        self.predictor = predictor
        self.aging_tokens_per_s = aging_tokens_per_s
        self.reads_true_length = predictor.reads_true_length
        self._keys: dict[int, tuple[float, int]] = {}  # request id -> key at its latest queuing

    def predicted_size(self, req: Request) -> float:
        """Median of ``req``'s predicted remaining output tokens."""
        return self.predictor.update(req, req.num_output_tokens).median

    def waiting_key(self, req: Request, now: float) -> Any:
        size = self.predicted_size(req)
        key = (size + self.aging_tokens_per_s * req.arrival_time, req.request_id)
        self._keys[req.request_id] = key
        return key

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        """Every running request was queued (keyed) before it ran: the scheduler's contract."""
        keys = self._keys
        return max(running, key=lambda r: (keys[r.request_id], r.admit_seq))
