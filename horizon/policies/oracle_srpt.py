"""Oracle shortest-remaining-processing-time: an upper bound, not a deployable policy.

The only built-in policy that reads the true output length. Waiting order: fewest true output
tokens still to emit (plus the prompt work still to compute); victim: most remaining.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from horizon.policies.base import Policy
from horizon.request import Request


class OracleSRPT(Policy):
    name = "oracle_srpt"
    reads_true_length = True

    def waiting_key(self, req: Request, now: float) -> Any:
        return (req.remaining_true_output, req.arrival_time, req.request_id)

    def choose_victim(self, running: Sequence[Request], needing: Request, now: float) -> Request:
        return max(running, key=lambda r: (r.remaining_true_output, r.admit_seq))
