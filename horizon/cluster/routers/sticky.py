"""``sticky``: a conversation's turns stay on the replica of its first turn (session
affinity), unless that replica is over a queue threshold; then the turn is routed least-loaded
and the conversation moves with it."""

from __future__ import annotations

from horizon.cluster.router import Router, least_loaded_index


class Sticky(Router):
    """Session affinity by ``request.conversation_id`` (requests without one, -1, go
    least-loaded).

    Args:
        threshold: waiting requests on the conversation's replica above which the turn moves
            (None: never moves).
    """

    name = "sticky"

    def __init__(self, threshold: int | None = 16) -> None:
        if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
            raise ValueError(f"sticky.threshold must be None or an int >= 0, got {threshold!r}")
        self.threshold = threshold
        self.home: dict[int, int] = {}  # conversation id -> replica index
        self.moves = 0

    def route(self, request, replicas, now):  # noqa: ANN001, ANN201 - Router.route
        cid = request.conversation_id
        if cid < 0:
            return least_loaded_index(replicas)
        at = self.home.get(cid)
        if at is not None and at < len(replicas):
            if self.threshold is None or replicas[at].num_waiting <= self.threshold:
                return at
            self.moves += 1
        at = least_loaded_index(replicas)
        self.home[cid] = at
        return at

    def check_integrity(self) -> None:
        assert all(i >= 0 for i in self.home.values())
