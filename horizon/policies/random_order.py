"""Random order: a seeded shuffle of the waiting queue, the same in every run with that seed.

A waiting request's key is a 64-bit hash of ``(seed, request_id)`` (SplitMix64's finaliser),
so it depends on nothing else: not on arrival times, on what ran before in the process or on
the order in which requests are keyed (no shared random generator). Ties (equal hashes, about
one in 2^64 per pair) go to the smaller request id. The victim of a preemption is the running
request last in that order (the base rule).
"""

from __future__ import annotations

from typing import Any

from horizon.policies.base import Policy
from horizon.request import Request

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit ints that scatters nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class RandomOrder(Policy):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"random.seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        self._salt = _mix64(seed)

    def waiting_key(self, req: Request, now: float) -> Any:
        return (_mix64(self._salt ^ req.request_id), req.request_id)
