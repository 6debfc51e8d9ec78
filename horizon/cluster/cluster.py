"""A cluster: N replicas behind one router. Every arrival is routed exactly once.

``route(request, now)`` asks the router for a replica over the replicas' views (live, or
``view_delay`` seconds stale), tells that replica it accepted the request and returns its index;
the caller (a backend's driver) hands the request to that replica's arrivals. The cluster keeps
the assignment of every request and the routing's own wall time.

Disaggregated (some replica's ``role`` is ``prefill``): the router chooses among the prefill
and mixed replicas, a request sent to a prefill replica is marked for handoff, and
``handoffs`` (``horizon.cluster.handoffs``) moves it to a decode replica that ``decode_router``
chooses; a one-token prompt goes straight to a decode replica (it has nothing to prefill), and
so does one no decode replica could ever hold (which rejects it, with the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from horizon.cluster.handoffs import Handoffs
from horizon.cluster.replica import Replica
from horizon.cluster.router import Router
from horizon.cluster.stale_view import StaleView
from horizon.cluster.view import LiveView, PromptHashes, ReplicaView
from horizon.request import Request


class Cluster:
    """Replicas, a router and the views it reads.

    Args:
        replicas: ``Replica`` objects with indices 0..N-1 in order (each its own Scheduler).
        router: decides; see ``horizon.cluster.router``.
        view_delay: seconds by which views lag the replicas (0: live).
        now: the run's clock (``now()``), which stale views read.
        live: read the replicas' schedulers directly (needs ``view_delay == 0``); None: live
            iff ``view_delay == 0``. False with delay 0: views read the replicas' latest
            reports (a driver whose replicas run elsewhere, as the engine's).
        decode_router: chooses the decode replica of a handed-off request (needed iff some
            replica's role is ``prefill``).
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        router: Router,
        view_delay: float = 0.0,
        now: Callable[[], float] | None = None,
        live: bool | None = None,
        decode_router: Router | None = None,
    ) -> None:
        if not replicas:
            raise ValueError("Cluster.replicas must hold at least one replica")
        if any(r.index != i for i, r in enumerate(replicas)):
            raise ValueError("Cluster.replicas must be indexed 0..N-1 in order")
        if not (isinstance(view_delay, (int, float)) and view_delay >= 0):
            raise ValueError(f"Cluster.view_delay must be a number >= 0, got {view_delay!r}")
        self.replicas = tuple(replicas)
        self.router = router
        self.view_delay = float(view_delay)
        self.hashes = PromptHashes()
        clock = now or (lambda: 0.0)
        self.views: tuple[ReplicaView, ...]
        live = view_delay == 0 if live is None else live
        if live and view_delay > 0:
            raise ValueError("Cluster: live views cannot also be delayed (view_delay > 0)")
        if not live:
            for r in replicas:
                if r.history is None:
                    r.keep_history()
            self.views = tuple(StaleView(r, self.hashes, view_delay, clock) for r in replicas)
        else:
            self.views = tuple(LiveView(r, self.hashes) for r in replicas)
        self.assignment: dict[int, int] = {}  # request id -> replica index (first stage)
        self.route_wall_s = 0.0
        self.handoffs = self._disaggregation(decode_router)

    def _disaggregation(self, decode_router: Router | None) -> Handoffs | None:
        roles = [r.role for r in self.replicas]
        self.routable = [True] * len(self.replicas)
        self.first_views = tuple(v for v, role in zip(self.views, roles) if role != "decode")
        if "prefill" not in roles:
            if "decode" in roles:
                raise ValueError("Cluster: decode replicas need prefill replicas to feed them")
            return None
        if decode_router is None:
            raise ValueError("Cluster.decode_router is needed when replicas have roles")
        return Handoffs(self.replicas, self.views, decode_router)

    def route(self, request: Request, now: float) -> int:
        """The replica ``request`` goes to (recorded; the replica is told).

        Raises:
            ValueError: the request was routed before, or the router returned no valid index.
        """
        rid = request.request_id
        if rid in self.assignment:
            raise ValueError(f"request {rid} was already routed")
        views, router = self.first_views, self.router
        h = self.handoffs
        if h is not None and (request.num_prompt_tokens < 2 or h.never_fits(request)):
            views, router = h.decode_views, h.router
        t0 = time.perf_counter()
        k = router.route(request, views, now)
        self.route_wall_s += time.perf_counter() - t0
        if not isinstance(k, int) or not 0 <= k < len(views):
            raise ValueError(
                f"router {router.name!r} returned {k!r} for request {rid}; "
                f"expected an int in 0..{len(views) - 1}"
            )
        i = views[k].index
        replica = self.replicas[i]
        request.handoff = replica.role == "prefill"
        replica.accept(request, now)
        known = self.hashes.known(request, replica.block_size)
        if known is not None:  # computed for a view: the replica need not hash again
            replica.seed_hashes(request, known)
        self.assignment[rid] = i
        return i

    def set_routable(self, index: int, routable: bool) -> None:
        """Offer replica ``index`` to the router or not (an autoscaler's starting and draining
        replicas are not); the router sees only routable replicas' views, the decode router
        only routable decode replicas'."""
        if self.routable[index] == routable:
            return
        self.routable[index] = routable
        if self.replicas[index].role == "decode":
            assert self.handoffs is not None
            self.handoffs.set_routable(index, routable)
            return
        self.first_views = tuple(
            v
            for v, r, ok in zip(self.views, self.replicas, self.routable)
            if ok and r.role != "decode"
        )
        if not self.first_views:
            raise ValueError("Cluster: no routable replica left (min_replicas must be >= 1)")

    @property
    def num_routed(self) -> int:
        return len(self.assignment)

    def check_integrity(self) -> None:
        """Every replica's invariants, the router's, and the routing counts agree."""
        for r in self.replicas:
            r.check_integrity()
        self.router.check_integrity()
        if self.handoffs is not None:
            self.handoffs.check_integrity()
            self.handoffs.router.check_integrity()
        counts = [0] * len(self.replicas)
        for i in self.assignment.values():
            counts[i] += 1
        assert counts == [r.routed for r in self.replicas], "routed counts differ from assignment"
