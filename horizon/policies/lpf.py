"""Longest prompt first: the waiting request with the most prompt tokens starts first.

Ties go to the earlier arrival, then the smaller request id. The victim of a preemption is
the running request last in that order: the shortest prompt, latest arrival (the base rule).
No aging: a short prompt can wait as long as longer ones keep arriving.
"""

from __future__ import annotations

from typing import Any

from horizon.policies.base import Policy
from horizon.request import Request


class LongestPromptFirst(Policy):
    name = "lpf"

    def waiting_key(self, req: Request, now: float) -> Any:
        return (-req.num_prompt_tokens, req.arrival_time, req.request_id)
