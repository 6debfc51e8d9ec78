"""The simulator's side of prefill/decode disaggregation: when handoffs are placed, and how long
their KV takes to move (``simulator.kv_link``).

The protocol is the cluster's (``horizon.cluster.handoffs``). Here: after every step's update of
a prefill replica, its handed-off requests are collected and placed at the step's end (when
their KV is ready); after every step of a decode replica (which may have freed blocks), pending
requests are placed again. A placed transfer sends its bytes over the fabric from its start;
when they are in, the source frees the blocks and the target's inbox admits the request.
With ``placement="reported"`` a placement is an offer that the decode replica takes or refuses
at a later step boundary (``simulator.reported_placement``); its transfer starts when taken.
With inline copies (``Placement.copy``) the fabric is not used: the boundary's copies run in
turn behind the decode replica's step in flight at the link's own speed, and the replica's host
waits for them (``SimBackend.hold``) before the plan that admits them. On a device whose turns
are simulated (``sharing='quantum'``) the copies are the replica's device work, queued behind
its step in flight and sharing the turns like a step (``SimBackend.queue``); the host waits for
the last one's event (``SimBackend.hold_on``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import simpy

from horizon.cluster import Cluster
from horizon.cluster.handoffs import Handoffs, Transfer
from horizon.model_shape import ModelShape
from simulator.kv_link import Fabric, LinkSpec, later, soon
from simulator.reported_placement import Placement, ReportedPlacement


class Host(Protocol):
    """A replica's backend as inline copies see it (``simulator.backend.SimBackend``)."""

    late_ends: bool  # a step's end is known when it is over: ``queue`` and ``hold_on``

    def busy_until(self, now: float) -> float: ...

    def hold(self, until: float) -> None: ...

    def queue(self, duration: float) -> simpy.Event: ...

    def hold_on(self, event: simpy.Event) -> None: ...


class TransferDriver:
    """Places handoffs and moves their KV on the simulated clock.

    Args:
        env: the run's SimPy environment.
        cluster: a disaggregated cluster (its ``handoffs`` set).
        shapes: each replica's model shape (a prefill replica's prices its KV bytes).
        link: the KV link between replicas (with inline copies, one copy's time alone).
        arrived: ``arrived(transfer)`` once a transfer's KV is in (the driver admits it).
        placement: ``live`` (reserve on the decode scheduler at once) or ``reported`` (as
            the engine's driver places; ``wake`` is then used), or a ``Placement``.
        wake: ``wake(index)`` wakes a decode replica's sleeping loop (reported placement).
    """

    def __init__(
        self,
        env: simpy.Environment,
        cluster: Cluster,
        shapes: Sequence[ModelShape | None],
        link: LinkSpec,
        arrived: Callable[[Transfer], None],
        placement: str | Placement = "live",
        wake: Callable[[int], None] | None = None,
    ) -> None:
        assert cluster.handoffs is not None
        timing = Placement.of(placement)
        for r, shape in zip(cluster.replicas, shapes):
            if r.role == "prefill" and shape is None:
                raise ValueError(f"ReplicaSetup.shape is needed on prefill replica {r.index}")
        self.env = env
        self.handoffs: Handoffs = cluster.handoffs
        self.replicas = cluster.replicas
        self.shapes = tuple(shapes)
        self.fabric = Fabric(env, link)
        self.arrived = arrived
        self._batch: list[Transfer] | None = None  # placed now, to begin once the placer yields
        self.reported: ReportedPlacement | None = None
        self.inline = timing.copy == "inline"
        self.link = link
        self.hosts: Sequence[Host] = ()  # inline copies: each replica's backend (``bind``)
        # decode replica -> its boundary's inline copies' last end, until it plans after them
        self._copied: dict[int, float] = {}
        if timing.kind == "reported":
            assert wake is not None
            begin = self._copy_inline if self.inline else self._begin
            self.reported = ReportedPlacement(env, self.handoffs, cluster.replicas, timing,
                                              begin, wake)  # fmt: skip

    def bind(self, hosts: Sequence[Host]) -> None:
        """Each replica's backend, where its steps in flight end and its host waits (needed
        for inline copies; ``Placement.copy``)."""
        self.hosts = tuple(hosts)

    def after_update(self, index: int) -> Callable[[], None] | None:
        """The serving loop's hook for replica ``index`` (None for a mixed replica)."""
        role, handoffs, env = self.replicas[index].role, self.handoffs, self.env
        if role == "prefill":

            def collected() -> None:
                ready = handoffs.collect(index)
                if ready is not None:
                    soon(env, lambda _ev: self._place_at(ready))

            return collected
        if role == "decode":

            reported = self.reported

            def freed() -> None:
                if reported is not None:
                    reported.reported(index)
                if handoffs.pending:
                    self._place(env.now)

            return freed
        return None

    # Scheduled callbacks, not a SimPy process per handoff; each runs where such a process's
    # step would, so events that fall on one instant keep their order (the records are
    # byte-identical to a driver of processes): placement after a collection runs once the
    # prefill loop has yielded (``soon``), at the KV's ready time; transfers placed by a decode
    # loop begin once it has yielded; a transfer waits for its start, then the link's latency.

    def _place_at(self, ready: float) -> None:
        env = self.env
        if ready > env.now:
            later(env, ready - env.now, self._place_now)
        else:
            self._place(env.now)

    def _place_now(self, _ev: object) -> None:
        if self.reported is not None:
            self._place(self.env.now)
            return
        assert self._batch is None  # an ordinary event: nothing placed now waits to begin
        self._begin(self.handoffs.place(self.env.now))

    def _place(self, now: float) -> None:
        if self.reported is not None:  # the engine's driver hears of a handoff once it is ready
            self.reported.sent(self.handoffs.place(now, ready_by=now))
            return
        started = self.handoffs.place(now)
        if not started:
            return
        if self._batch is None:
            self._batch = []
            soon(self.env, self._begin_batch)
        self._batch.extend(started)

    def _begin_batch(self, _ev: object) -> None:
        batch, self._batch = self._batch, None
        assert batch is not None
        self._begin(batch)

    def _begin(self, transfers: list[Transfer]) -> None:
        """Transfers starting later wait for their start; the rest send now, after them."""
        env, now, at_once = self.env, self.env.now, []
        for t in transfers:
            if t.start > now:
                later(env, t.start - now, partial(self._send, t))
            else:
                at_once.append(t)
        for t in at_once:
            self._send(t)

    def kv_bytes(self, t: Transfer) -> int:
        """Bytes of ``t``'s blocks (whole blocks move, as in a paged engine)."""
        shape = self.shapes[t.src]
        assert shape is not None
        bs = self.replicas[t.src].block_size
        return t.num_blocks * bs * shape.kv_bytes_per_token()

    def _send(self, t: Transfer, _ev: object = None) -> None:
        self.fabric.send(t.src, t.dst, self.kv_bytes(t), partial(self._arrive, t))

    def _arrive(self, t: Transfer, _ev: object = None) -> None:
        self.handoffs.complete(t, self.env.now)
        self.arrived(t)

    def _copy_inline(self, transfers: list[Transfer]) -> None:
        """Imports just taken at a decode replica's boundary (``Placement.copy='inline'``):
        copied one after another behind its step in flight; its host waits for the last. Each
        after the first starts when the one before it is in (the engine's reading: it takes
        them in turn, each waiting for its copy)."""
        env, now = self.env, self.env.now
        dst = transfers[0].dst
        host = self.hosts[dst]
        if host.late_ends:
            self._queue_inline(host, transfers)
            return
        end = host.busy_until(now)
        for k, t in enumerate(transfers):
            assert t.dst == dst and t.start == now
            if k:
                t.start = now + (end - now)
            end += self.link.time(self.kv_bytes(t))
            later(env, end - now, partial(self._arrive, t))
        host.hold(end)
        self._copied[dst] = now + (end - now)  # the clock's reading when the host is free

    def _queue_inline(self, host: Host, transfers: list[Transfer]) -> None:
        """``_copy_inline`` on a late-end device: each copy is queued there behind the step in
        flight; the next one starts (as recorded) when it is in; the host waits for the last."""
        dst = transfers[0].dst
        self._copied[dst] = math.inf  # until the last copy is in

        def arrive(k: int, ev: simpy.Event) -> None:
            t = transfers[k]
            if k + 1 < len(transfers):
                transfers[k + 1].start = ev.value
            else:
                self._copied[dst] = ev.value
            self._arrive(t)

        event = None
        for k, t in enumerate(transfers):
            assert t.dst == dst and t.start == self.env.now
            event = host.queue(self.link.time(self.kv_bytes(t)))
            event.callbacks.append(partial(arrive, k))
        host.hold_on(event)

    def take(self, index: int, now: float) -> None:
        """Decode replica ``index``'s step boundary (reported placement): the imports that
        reached it are taken or refused; a refusal places again (others may fit). With
        inline copies, a boundary's host waits for its copies and then plans without taking
        again: admissions before the copies end, and the first after, take nothing."""
        assert self.reported is not None
        copied = self._copied.get(index)
        if copied is not None:
            if now >= copied:
                del self._copied[index]
            return
        if self.reported.take(index, now) and self.handoffs.pending:
            self._place(now)

    def check_integrity(self) -> None:
        self.fabric.check_integrity()
        if self.reported is not None:
            self.reported.check_integrity()
        assert self.inline or not self._copied, "inline copies' ends without inline copies"
        if self.inline:
            assert len(self.hosts) == len(self.replicas), "inline copies need bind(hosts)"
