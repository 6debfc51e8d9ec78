"""Handoffs placed as the engine's driver places them: on reports, taken at a step boundary.

``ClusterSimulation(..., placement="reported")``. The engine's driver knows a decode worker
only by its step reports, so it places a handed-off request on the free blocks of the
worker's latest step end less the imports sent since (``horizon.cluster.reported_imports``),
and the import reaches the worker ``message_s`` later, at its next step boundary from then on
(``executor.kv_agent``): the worker reserves the blocks there if they fit then, and the KV
transfer starts; else it refuses, the request is pending again, and that worker is offered
nothing until its next step end. Meanwhile the worker's own plans keep taking blocks (its
running requests grow, its preempted ones come back), which the ``"live"`` placement never
lets them do first: it reserves on the decode scheduler itself, at the step end that freed the
blocks. ``reported`` is the default: on the H200's P/D cases the engine takes its imports
after one plan of its own, as this placement does (docs/cluster.md).

A plan that preempts first retires the engine's step in flight (``EngineBackend.drains_before``),
so that step's report goes out before the plan is submitted, and the worker's next boundary
comes only after the plan's host work: an import placed on that report is there at the next
boundary if the driver's round trip (``message_s``) is shorter than that host work
(``drain_s``). The simulator's host takes no time, so ``drain_s`` says it: on the CPU, where
a step runs inside its submission, it is the step's own time; on a GPU the submission's host
work (``Placement``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import simpy

from horizon.cluster.handoffs import Handoffs, Transfer
from horizon.cluster.replica import Replica
from horizon.cluster.reported_imports import HeldBlocks, ReportedImports
from horizon.request import Request
from horizon.scheduler import Scheduler
from simulator.kv_link import later

PLACEMENTS = ("live", "reported")
COPIES = ("link", "inline")
# A placement's two queue hops on the engine (a step report to the driver, its import to the
# worker): the driver routes an arrival within 0.08-0.10 ms (p50, one hop; BENCHMARKS.md).
MESSAGE_S = 0.0002


@dataclass(frozen=True)
class Placement:
    """How a disaggregated cluster's handoffs are placed (module docstring): ``kind``
    ``live`` or ``reported``; for ``reported``, ``message_s`` (a placement to its import's
    arrival at the decode replica) and ``drain_s`` (a preempting plan's host work on the
    engine, from the report it sends first to the next step boundary).

    ``copy``: how a taken import's KV moves. ``link``: over the fabric from its start, with
    the link's latency and contention (``simulator.kv_link``), the request admitted at the
    decode replica's next step boundary after it is in. ``inline`` (``reported`` only): as the
    engine's decode worker copies (``executor.kv_agent.take_import``): at the boundary that
    takes them, the copies run one after another behind the replica's step in flight, each
    taking the link's time alone; the replica's host waits for them, and its next plan, made
    when the last is in, holds them (the link is then the idle copy's fit)."""

    kind: str = "reported"
    message_s: float = MESSAGE_S
    drain_s: float = 0.0
    copy: str = "link"

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENTS:
            raise ValueError(f"ClusterSimulation.placement must be one of {PLACEMENTS}, got "
                             f"{self.kind!r}")  # fmt: skip
        if self.copy not in COPIES:
            raise ValueError(f"Placement.copy must be one of {COPIES}, got {self.copy!r}")
        if self.copy == "inline" and self.kind != "reported":
            raise ValueError(f"Placement.copy='inline' needs kind 'reported', got {self.kind!r}")
        for name in ("message_s", "drain_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Placement.{name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def of(cls, placement: str | Placement) -> Placement:
        return placement if isinstance(placement, Placement) else cls(placement)


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
        timing: its ``message_s`` and ``drain_s`` (``Placement``).
        begin: starts the KV transfers of imports taken (their ``start`` is set).
        wake: ``wake(index)`` wakes decode replica ``index``'s loop if it sleeps.
    """

    def __init__(
        self,
        env: simpy.Environment,
        handoffs: Handoffs,
        replicas: Sequence[Replica],
        timing: Placement,
        begin: Callable[[list[Transfer]], None],
        wake: Callable[[int], None],
    ) -> None:
        self.env, self.handoffs, self.replicas = env, handoffs, tuple(replicas)
        self.message_s = float(timing.message_s)
        self.after_drain_s = max(timing.message_s - timing.drain_s, 0.0)
        self.begin, self.wake = begin, wake
        self.imports = {r.index: LocalImports(r.scheduler) for r in replicas if r.role == "decode"}
        self.offers: dict[int, deque[tuple[float, Transfer]]] = {i: deque() for i in self.imports}
        self.refusals = 0
        self._drained: tuple[int, float] | None = None  # (replica, time) of a drained report
        handoffs.place_through(self.imports)

    def reported(self, index: int) -> None:
        """Decode replica ``index`` ended a step: its report (sent before its latest plan if
        that plan preempted: module docstring)."""
        self.imports[index].reported()
        drained = self.replicas[index].scheduler.recorder.last_preempted > 0
        self._drained = (index, self.env.now) if drained else None

    def sent(self, transfers: list[Transfer]) -> None:
        """Placed now: each import reaches its replica ``message_s`` from now, or, placed on
        a drained report, ``message_s - drain_s`` after the replica's next boundary (now)."""
        now, drained = self.env.now, self._drained
        for t in transfers:
            delay = self.message_s
            if drained is not None and drained == (t.dst, now):
                delay = self.after_drain_s
            self.offers[t.dst].append((now + delay, t))
            later(self.env, delay, lambda _ev, d=t.dst: self.wake(d))

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
