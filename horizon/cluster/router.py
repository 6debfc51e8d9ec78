"""The router interface: decisions only.

A ``Router`` picks the replica for each arriving request: ``route(request, replicas, now)``
returns an index into ``replicas``, a sequence of read-only ``ReplicaView``s (one per replica,
in the cluster's order; possibly stale, see ``horizon.cluster.view``). It never touches a
replica: the cluster hands the request over. Every request is routed exactly once, at its
arrival. A router may keep state of its own decisions (a round-robin counter, a conversation's
replica), which ``check_integrity`` asserts. Routers are registered by name
(``horizon.cluster.routers``) and also load from ``package.module:Class``; their constructor's
keyword arguments are their knobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from horizon.cluster.view import ReplicaView
from horizon.request import Request


class Router:
    """Base router: every request to replica 0 (subclasses override ``route``)."""

    name = "base"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        """The index of the replica ``request`` goes to, in ``range(len(replicas))``."""
        return 0

    def check_integrity(self) -> None:
        """Assert the router's own state is consistent (none by default)."""


def argmin(replicas: Sequence[ReplicaView], key: Callable[[ReplicaView], float]) -> int:
    """Index of the replica with the smallest ``(key, routed, index)``: ties go to the replica
    that has been sent the fewest requests, then the lowest index."""
    best, at = None, 0
    for i, v in enumerate(replicas):
        k = (key(v), v.routed, i)
        if best is None or k < best:
            best, at = k, i
    return at


def least_loaded_index(replicas: Sequence[ReplicaView]) -> int:
    """The replica with the fewest waiting plus running requests (ties: ``argmin``'s)."""
    try:
        keys = list(map(_load_key, replicas))  # (v.load, v.routed) each
    except AttributeError:  # views not derived from ReplicaView: no load_key
        keys = [(v.load, v.routed) for v in replicas]
    return keys.index(min(keys)) if keys else 0  # the first of the smallest keys


_load_key = attrgetter("load_key")
