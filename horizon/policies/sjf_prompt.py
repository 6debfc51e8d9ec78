"""Shortest prompt first with linear aging (what serving engines ship as "priority").

Priority of a waiting request: ``prompt_tokens - aging_tokens_per_s * wait``; smaller first. The
waiting order is time-invariant (``prompt + rate * arrival``), so aging bounds every wait: a
request arriving ``w`` seconds earlier beats any prompt up to ``rate * w`` tokens shorter.
"""

from __future__ import annotations

import math
from typing import Any

from horizon.policies.base import Policy
from horizon.request import Request


class SJFPrompt(Policy):
    name = "sjf_prompt"

    def __init__(self, aging_tokens_per_s: float = 100.0) -> None:
        if not math.isfinite(aging_tokens_per_s) or aging_tokens_per_s < 0:
            raise ValueError(
                f"sjf_prompt.aging_tokens_per_s must be finite and >= 0, got {aging_tokens_per_s!r}"
            )
        self.aging_tokens_per_s = aging_tokens_per_s

    def waiting_key(self, req: Request, now: float) -> Any:
        return (req.num_prompt_tokens + self.aging_tokens_per_s * req.arrival_time, req.request_id)
