"""Prefill/decode disaggregation: the cluster's side of moving a prefilled request's KV.

Replica roles (``Replica.role``): ``mixed`` serves a request end to end; ``prefill`` computes a
routed request's prompt but its last token and hands it off; ``decode`` takes handed-off requests
(and, directly, prompts of one token). The protocol, on any backend:

1. A prefill replica's scheduler hands a request off after the step that computed it
   (``Scheduler.take_handoffs``): its blocks stay held there. ``collect`` queues it, pending.
2. ``place`` gives each pending request, oldest first, a decode replica chosen by the decode
   router among the decode replicas that can reserve its blocks now (``Scheduler.can_import``;
   the router sees only those); the blocks are reserved there (``reserve_import``) and a
   ``Transfer`` starts. A request no decode replica can fit stays pending (it never lands where
   it cannot fit); the driver calls ``place`` again when decode replicas free blocks.
3. The backend moves the KV (modelled by the simulator's link model, copied by the engine) and
   calls ``complete``: the prefill replica frees its blocks (prompt blocks stay in its prefix
   cache). The driver then tells the decode replica (``Scheduler.finish_import``, at once or at
   its next step boundary), which admits the request ahead of waiting ones: its last prompt
   token emits the first output token there.

So a request's blocks are held on its prefill replica alone while pending, on both during the
transfer, and on its decode replica alone after it (``check_integrity``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from horizon.cluster.replica import Replica
from horizon.cluster.router import Router
from horizon.cluster.view import ReplicaView
from horizon.request import Request

ROLES = ("mixed", "prefill", "decode")


@dataclass(slots=True, eq=False)
class Transfer:
    """One request's KV moving from replica ``src`` to ``dst``: ``num_tokens`` tokens in
    ``num_blocks`` blocks; handed off (KV ready) at ``ready``, blocks reserved on ``dst`` and
    transfer started at ``start``, arrived at ``end`` (NaN while in flight); ``placed``: when
    ``place`` chose ``dst`` (a driver that places on reports: before ``start``, which the
    target sets), after ``refusals`` refused placements of the request."""

    request: Request
    src: int
    dst: int
    num_tokens: int
    num_blocks: int
    ready: float
    start: float
    end: float = math.nan
    placed: float = math.nan
    refusals: int = 0


TRANSFER_COLUMNS = ("request_id", "src", "dst", "num_tokens", "num_blocks", "ready", "start",
                    "end", "placed", "refusals")  # fmt: skip
INT_COLUMNS = ("request_id", "src", "dst", "num_tokens", "num_blocks", "refusals")


class Handoffs:
    """Pending handoffs, transfers in flight and done (see the module docstring).

    Args:
        replicas: the cluster's replicas (their ``role`` decides who prefills and who decodes).
        views: the cluster's views of them, in the same order.
        router: the decode router (decisions only, over the fitting decode replicas' views).
    """

    def __init__(
        self, replicas: Sequence[Replica], views: Sequence[ReplicaView], router: Router
    ) -> None:
        self.replicas = tuple(replicas)
        self.router = router
        self._all_decode = tuple(v for v, r in zip(views, replicas) if r.role == "decode")
        if not self._all_decode:
            raise ValueError("Cluster: prefill replicas need at least one decode replica")
        self._closed: set[int] = set()  # decode replicas not routable (an autoscaler's)
        self._importers: dict = {}  # decode replica index -> stand-in (``place_through``)
        self._offer()
        self.pending: list[tuple[Request, int, float]] = []  # (request, src, ready)
        self.in_flight: dict[int, Transfer] = {}
        self.done: list[Transfer] = []
        self._refusals: dict[int, int] = {}  # pending request id -> its refused placements
        self.route_wall_s = 0.0

    def _offer(self) -> None:
        """The routable decode views, each with its replica's scheduler (a view's index never
        changes)."""
        self.decode_views = tuple(v for v in self._all_decode if v.index not in self._closed)
        if not self.decode_views:
            raise ValueError("Cluster: no routable decode replica left (min_replicas >= 1)")
        self._decoders = tuple((v, self._importer(v.index)) for v in self.decode_views)

    def _importer(self, index: int):  # noqa: ANN202 - a Scheduler or a stand-in of one
        """Whom ``place`` asks and reserves on for decode replica ``index``."""
        return self._importers.get(index) or self.replicas[index].scheduler

    def place_through(self, importers: dict) -> None:  # replica index -> stand-in
        """Place on these stand-ins of decode replicas' schedulers (``can_import``,
        ``reserve_import``, ``import_blocks``, ``never_fits``, ``kv.blocks_of``) instead of
        the schedulers: a driver that knows them by their reports
        (``horizon.cluster.reported_imports``). A transfer is then in flight from its
        placement, and its target reserves the blocks, or refuses (``refused``), later."""
        if not all(self.replicas[i].role == "decode" for i in importers):
            raise ValueError("Handoffs.place_through: stand-ins are for decode replicas only")
        self._importers = dict(importers)
        self._offer()

    def set_routable(self, index: int, routable: bool) -> None:
        """Offer decode replica ``index`` to the decode router or not: one not offered takes
        no new handoff (those in flight to it arrive)."""
        (self._closed.discard if routable else self._closed.add)(index)
        self._offer()

    def never_fits(self, r: Request) -> bool:
        """Whether no decode replica could ever hold ``r`` (it is then routed to one directly,
        which rejects it with the reason)."""
        return all(self.replicas[v.index].scheduler.never_fits(r) for v in self.decode_views)

    def collect(self, src: int) -> float | None:
        """Queue the requests replica ``src`` has handed off since the last call; returns the
        latest time their KV is ready (None if there were none)."""
        got = self.replicas[src].scheduler.take_handoffs()
        for r, ready in got:
            self.replicas[src].leave(r)
            self.pending.append((r, src, ready))
        return max(t for _, t in got) if got else None

    def place(self, now: float, ready_by: float = math.inf) -> list[Transfer]:
        """Start a transfer for every pending request (oldest first) whose KV is ready by
        ``ready_by`` and that a decode replica can take now; returns the transfers started."""
        started, kept = [], []
        for r, src, ready in self.pending:
            if ready > ready_by:
                kept.append((r, src, ready))
                continue
            fits = [v for v, sched in self._decoders if sched.can_import(r)]
            if not fits:
                kept.append((r, src, ready))
                continue
            t0 = time.perf_counter()
            k = self.router.route(r, fits, now)
            self.route_wall_s += time.perf_counter() - t0
            if not isinstance(k, int) or not 0 <= k < len(fits):
                raise ValueError(
                    f"decode router {self.router.name!r} returned {k!r} for request "
                    f"{r.request_id}; expected an int in 0..{len(fits) - 1}"
                )
            started.append(self._start(r, src, fits[k].index, ready, now))
        self.pending = kept
        return started

    def _start(self, r: Request, src: int, dst: int, ready: float, now: float) -> Transfer:
        sched = self._importer(dst)
        sched.reserve_import(r)
        self.replicas[dst].accept_import(r)
        n = r.num_computed_tokens
        t = Transfer(r, src, dst, n, -(-n // sched.pool.block_size), ready, max(now, ready),
                     placed=now, refusals=self._refusals.pop(r.request_id, 0))  # fmt: skip
        self.in_flight[r.request_id] = t
        return t

    def complete(self, t: Transfer, now: float) -> None:
        """``t``'s KV has arrived at ``now``: free it on its source (the driver then calls the
        target's ``finish_import``)."""
        del self.in_flight[t.request.request_id]
        t.end = now
        self.replicas[t.src].scheduler.release_handoff(t.request)
        self.done.append(t)

    def refused(self, t: Transfer) -> None:
        """``t``'s target could not reserve the blocks after all (an engine driver places on
        reported free blocks; the replica decides): ``t`` is pending again, in ready order."""
        rid = t.request.request_id
        del self.in_flight[rid]
        self._refusals[rid] = t.refusals + 1
        self.pending.append((t.request, t.src, t.ready))
        self.pending.sort(key=lambda p: p[2])

    @property
    def idle(self) -> bool:
        return not self.pending and not self.in_flight

    def table(self) -> dict[str, np.ndarray]:
        """Every transfer (done, then in flight) as columns ``TRANSFER_COLUMNS``."""
        ts = self.done + list(self.in_flight.values())
        rows = [
            (t.request.request_id, t.src, t.dst, t.num_tokens, t.num_blocks)
            + (t.ready, t.start, t.end, t.placed, t.refusals)
            for t in ts
        ]
        a = np.array(rows, dtype=np.float64).reshape(-1, len(TRANSFER_COLUMNS))
        out = {c: a[:, i] for i, c in enumerate(TRANSFER_COLUMNS)}
        for c in INT_COLUMNS:
            out[c] = out[c].astype(np.int64)
        return out

    def check_integrity(self) -> None:
        """Blocks sit where the protocol says: pending on the source only, in flight on both,
        done on neither source (freed) nor anywhere but its target or finished."""
        for r, src, _ in self.pending:
            assert self.replicas[src].scheduler.kv.blocks_of(r), f"pending {r.request_id}"
            self._held_only_on(r, {src})
        for t in self.in_flight.values():
            self._held_only_on(t.request, {t.src, t.dst})
            assert math.isnan(t.end), "a transfer in flight has an end"
        for t in self.done:
            assert not self.replicas[t.src].scheduler.kv.blocks_of(t.request), "not freed"
        assert self._refusals.keys() <= {r.request_id for r, _, _ in self.pending}, "refusals"

    def _held_only_on(self, r: Request, where: set[int]) -> None:
        for i in range(len(self.replicas)):
            held = bool(self._importer(i).kv.blocks_of(r))
            assert held == (i in where), f"request {r.request_id}: blocks on replica {i}: {held}"
