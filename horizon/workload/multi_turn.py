"""Interleaving of multi-turn conversations into one arrival order.

``concurrency`` conversations are active at once. Arrival slots go round-robin over the active
conversations, each giving its next turn; a conversation that runs out of turns gives its place
to the next one from the queue. Turns of one conversation therefore arrive in order, interleaved
with the others::

    concurrency 2, conversations A(3 turns) B(1) C(2):   A0 B0 A1 C0 A2 C1
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from horizon.workload.turns import RequestSpec


class TooFewRequests(ValueError):
    """The conversations hold ``available`` usable turns, fewer than the ``wanted`` requests."""

    def __init__(self, available: int, wanted: int) -> None:
        self.available = available
        self.wanted = wanted
        super().__init__(f"only {available} usable turns for {wanted} requests (after filters)")


def interleave(
    conversations: Iterable[list[RequestSpec]], n: int, concurrency: int
) -> list[RequestSpec]:
    """The first ``n`` turns in round-robin arrival order (see the module docstring).

    ``conversations`` is consumed lazily, only as far as needed; empty ones are skipped.

    Raises:
        TooFewRequests: the conversations hold fewer than ``n`` turns (a ValueError).
    """
    queue = (deque(c) for c in conversations if c)
    active: deque[deque[RequestSpec]] = deque()
    for turns in queue:
        active.append(turns)
        if len(active) == concurrency:
            break
    order: list[RequestSpec] = []
    while len(order) < n:
        if not active:
            raise TooFewRequests(len(order), n)
        turns = active.popleft()
        order.append(turns.popleft())
        if turns:
            active.append(turns)
        elif len(order) < n:  # pull a new conversation only if it will be used
            nxt = next(queue, None)
            if nxt is not None:
                active.append(nxt)
    return order
