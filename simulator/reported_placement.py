"""Handoffs placed as the engine's driver places them: on reports, taken at a step boundary.

``ClusterSimulation(..., placement="reported")``. The engine's driver knows a decode worker
only by its step reports, so it places a handed-off request on the free blocks of the
worker's latest step end less the imports sent since (``horizon.cluster.reported_imports``),
and the import reaches the worker ``message_s`` later, at its next step boundary from then on
(``executor.kv_agent``): the worker reserves the blocks there if they fit then, and the KV
transfer starts; else it refuses, the request is pending again, and that worker is offered
nothing until its next step end. Meanwhile the worker's own plans keep taking blocks (its
running requests grow, its preempted ones come back), which the default ``"live"`` placement
never lets them do first: it reserves on the decode scheduler itself, at the step end that
freed the blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import simpy

from horizon.cluster.handoffs import Handoffs, Transfer
from horizon.cluster.replica import Replica
from horizon.cluster.reported_imports import HeldBlocks, ReportedImports
from horizon.request import Request
from horizon.scheduler import Scheduler
from simulator.kv_link import later

PLACEMENTS = ("live", "reported")
# A placement's two queue hops on the engine (a step report to the driver, its import to the
# worker): the driver routes an arrival within 0.08-0.10 ms (p50, one hop; BENCHMARKS.md).
MESSAGE_S = 0.0002


class _LocalBlocks(HeldBlocks):
    """Placeholders while an import is offered, then the scheduler's own blocks."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched.pool.block_size)
        self.sched = sched

    def blocks_of(self, r: Request) -> Sequence[int]:
        return self.held.get(r.request_id) or self.sched.kv.blocks_of(r)


class LocalImports(ReportedImports):
    """``ReportedImports`` of a simulated decode replica: its report is its free blocks at its
    latest step end (``reported``)."""

    def __init__(self, sched: Scheduler) -> None:
        c = sched.config
        self._free = sched.pool.num_free  # an empty replica's state before any report
        super().__init__(c.num_blocks, c.block_size, c.max_model_len, lambda: self._free)
        self.kv = self.pool = _LocalBlocks(sched)
        self.sched = sched

    def reported(self) -> None:
        self._free = self.sched.pool.num_free
        super().reported()

    def answered(self, r: Request, imported: bool) -> None:
        super().answered(r, imported)
        if imported:
            del self.kv.held[r.request_id]  # its blocks are the scheduler's now


class ReportedPlacement:
    """The offers in flight to each decode replica and their taking (module docstring).

    Args:
        env: the run's SimPy environment.
        handoffs: the cluster's handoffs (placed through this object's stand-ins from now on).
        replicas: the cluster's replicas.
        message_s: seconds from a placement to the import's arrival at its decode replica.
        begin: starts the KV transfers of imports taken (their ``start`` is set).
        wake: ``wake(index)`` wakes decode replica ``index``'s loop if it sleeps.
    """

    def __init__(
        self,
        env: simpy.Environment,
        handoffs: Handoffs,
        replicas: Sequence[Replica],
        message_s: float,
        begin: Callable[[list[Transfer]], None],
        wake: Callable[[int], None],
    ) -> None:
        if not (isinstance(message_s, (int, float)) and message_s >= 0):
            raise ValueError(f"ClusterSimulation.message_s must be >= 0, got {message_s!r}")
        self.env, self.handoffs, self.replicas = env, handoffs, tuple(replicas)
        self.message_s = float(message_s)
        self.begin, self.wake = begin, wake
        self.imports = {r.index: LocalImports(r.scheduler) for r in replicas if r.role == "decode"}
        self.offers: dict[int, deque[tuple[float, Transfer]]] = {i: deque() for i in self.imports}
        self.refusals = 0
        handoffs.place_through(self.imports)

    def reported(self, index: int) -> None:
        """Decode replica ``index`` ended a step: its report."""
        self.imports[index].reported()

    def sent(self, transfers: list[Transfer]) -> None:
        """Placed now: each import reaches its replica ``message_s`` from now."""
        due = self.env.now + self.message_s
        for t in transfers:
            self.offers[t.dst].append((due, t))
            later(self.env, self.message_s, lambda _ev, d=t.dst: self.wake(d))

    def due(self, index: int, now: float) -> bool:
        q = self.offers.get(index)
        return bool(q) and q[0][0] <= now

    def take(self, index: int, now: float) -> bool:
        """Replica ``index``'s step boundary at ``now``: the imports that reached it are
        reserved or refused; returns whether one was refused (the caller places again)."""
        q = self.offers.get(index)
        if not q or q[0][0] > now:
            return False
        imports, replica, started, refused = self.imports[index], self.replicas[index], [], False
        sched = replica.scheduler
        while q and q[0][0] <= now:
            _, t = q.popleft()
            r = t.request
            if sched.can_import(r):
                sched.reserve_import(r)
                imports.answered(r, True)
                t.start = now
                started.append(t)
            else:
                imports.answered(r, False)
                replica.refuse_import(r)
                self.handoffs.refused(t)
                self.refusals += 1
                refused = True
        if started:
            self.begin(started)
        return refused

    def check_integrity(self) -> None:
        for i, imp in self.imports.items():
            imp.check_integrity()
            offered = {t.request.request_id for _, t in self.offers[i]}
            assert offered == set(imp.sent), f"decode replica {i}: offers and sent imports differ"
            in_flight = self.handoffs.in_flight
            for _, t in self.offers[i]:
                assert t.dst == i and t.request.request_id in in_flight, "an offer not in flight"
