"""``round_robin``: replicas in turn, ignoring their state (Vidur's and BLIS's baseline)."""

from __future__ import annotations

from horizon.cluster.router import Router


class RoundRobin(Router):
    """Request k goes to replica k mod N. No knobs."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        i = self._next % len(replicas)
        self._next = i + 1
        return i

    def check_integrity(self) -> None:
        assert self._next >= 0
