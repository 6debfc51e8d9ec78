"""The SimPy twin of a cluster: one environment, N replica engine processes and the router.

Each replica runs the single-replica serving loop (``horizon.serving_loop.serve``) on its own
Scheduler, policy, block pool and cost model, with its backend wrapped in an ``ObservedBackend``
that tells its ``Replica`` (and the session release) of every step. An arrival process routes
each request at its arrival time through the ``Cluster`` and drops it in the chosen replica's
inbox, waking that replica if it sleeps. Routing costs O(replicas) view reads per request (plus
O(prompt blocks) per replica for a router that reads prefix hits); nothing scans the pools.

Closed-loop sessions (``horizon.cluster.SessionRelease``): a turn's successor is scheduled when
the turn's finishing step ends, at that time plus the think time.

Prefill/decode disaggregation (replicas with roles ``prefill`` and ``decode``, a decode router
and a KV link): ``simulator.cluster_transfers`` places handoffs and moves their KV.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from horizon.cluster import Cluster, ClusterRecords, ObservedBackend, Replica, SessionRelease
from horizon.cluster.router import Router
from horizon.model_shape import ModelShape
from horizon.plan import StepPlan, StepResult
from horizon.policies.base import Policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.serving_loop import serve
from simulator.autoscaling import AutoscaleConfig, Autoscaling
from simulator.backend import SimBackend
from simulator.cluster_transfers import TransferDriver
from simulator.cost_model import CostModel
from simulator.device_sharing import DeviceSpec
from simulator.kv_link import LinkSpec
from simulator.reported_placement import Placement
from simulator.shared_device import SharedDevice
from simulator.simulation import SimClock


@dataclass(frozen=True, eq=False)
class ReplicaSetup:
    """One replica's parts: its scheduler config, its own policy object (never shared), its
    cost model, and optionally its model shape, a predictor (for views), a label, the GPU it
    runs on (replicas naming the same ``device`` share one GPU: a name serializes their steps
    first come first served, a ``DeviceSpec(name, "timeslice")`` time-slices them,
    ``simulator.shared_device``; ``None``: a GPU of its own) and its role
    (``mixed``, or ``prefill`` / ``decode`` for disaggregated serving)."""

    config: SchedulerConfig
    policy: Policy
    cost_model: CostModel
    shape: ModelShape | None = None
    predictor: object = None
    name: str | None = None
    device: str | DeviceSpec | None = None
    role: str = "mixed"


class ClusterSimulation:
    """One simulated cluster run; ``run()`` returns ``ClusterRecords``; single-use.

    Args:
        requests: open-loop requests (fresh), routed at their arrival times.
        replicas: one ``ReplicaSetup`` per replica (heterogeneous allowed).
        router: the routing policy.
        sessions: closed-loop sessions (``horizon.workload.sessions``), besides ``requests``.
        view_delay: seconds by which the router's views lag (0: live).
        live: as ``Cluster``'s: False with ``view_delay`` 0 routes on each replica's latest
            step-end report, as the engine's driver does; None: live iff no delay.
        max_time, check_every, arrivals_at_step_boundaries, pipelined: as
            ``simulator.Simulation``'s, for every replica.
        decode_router, kv_link: for disaggregated replicas, the router that places a
            handed-off request on a decode replica and the link its KV crosses.
        placement: how handoffs are placed: ``reported`` (the default) places on each decode
            replica's latest step-end free blocks and the replica takes the import (or refuses
            it) at its first step boundary after the message's delay, as on the engine;
            ``live`` reserves on the decode scheduler at the step end that freed the blocks; a
            ``Placement`` sets the delays and how the KV is copied (over the fabric, or
            inline behind the decode replica's step in flight: ``simulator.reported_placement``).
        autoscaler, autoscale: an autoscaler over the replicas (the most it may provision)
            and its settings (``simulator.autoscaling``); None: every replica always on. With
            prefill/decode roles, one of each per role (``{"prefill": ..., "decode": ...}``).
    """

    def __init__(
        self,
        requests: Sequence[Request],
        replicas: Sequence[ReplicaSetup],
        router: Router,
        sessions: Sequence = (),
        view_delay: float = 0.0,
        max_time: float | None = None,
        check_every: int = 0,
        arrivals_at_step_boundaries: bool = False,
        pipelined: bool = False,
        decode_router: Router | None = None,
        kv_link: LinkSpec | None = None,
        autoscaler=None,  # noqa: ANN001 - horizon.cluster.Autoscaler, or one per role
        autoscale: AutoscaleConfig | dict[str, AutoscaleConfig] | None = None,
        live: bool | None = None,
        placement: str | Placement = "reported",
    ) -> None:
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0, got {max_time!r}")
        if len({id(s.policy) for s in replicas}) != len(replicas):
            raise ValueError("ReplicaSetup.policy: every replica needs its own policy object")
        self.env = env = simpy.Environment()
        self.clock = SimClock(env)
        self.end = math.inf if max_time is None else max_time
        self.check_every = check_every
        self.release = SessionRelease(sessions)
        self.open_loop = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self.all_ids = [r.request_id for r in self.open_loop] + [
            r.request_id for s in sessions for r in s.requests
        ]
        now = self.clock.now
        reps = [
            Replica(i, Scheduler(s.config, s.policy), s.shape, s.predictor, s.name, now, s.role)
            for i, s in enumerate(replicas)
        ]
        self.cluster = Cluster(reps, router, view_delay, now, live, decode_router=decode_router)
        self.inboxes = [Inbox(env, arrivals_at_step_boundaries, r.scheduler) for r in reps]
        self.transfers = self._transfers(replicas, kv_link, Placement.of(placement))
        self._prefill_loops = sum(r.role == "prefill" for r in reps)
        self.autoscale = None
        if autoscaler is not None:
            self.autoscale = Autoscaling(env, self.cluster, autoscaler, autoscale)
        names = sorted({s.device for s in replicas if s.device is not None})
        self.devices = {d: SharedDevice(d, env) for d in names}
        self._sims: list[SimBackend] = []  # each replica's own, under any observer
        self.backends = [self._backend(s, r, pipelined) for s, r in zip(replicas, reps)]
        if self.transfers is not None:
            self.transfers.bind(self._sims)
        self._open_loop_done = False

    def _transfers(self, setups, link, placement: Placement):  # noqa: ANN001, ANN202
        if self.cluster.handoffs is None:
            return None
        if link is None:
            raise ValueError("ClusterSimulation.kv_link is needed for prefill/decode replicas")
        shapes = [s.shape for s in setups]
        inboxes = self.inboxes
        driver = TransferDriver(self.env, self.cluster, shapes, link, self._arrived, placement,
                                lambda i: inboxes[i].wake())  # fmt: skip
        if driver.reported is not None:
            for r, box in zip(self.cluster.replicas, inboxes):
                if r.role == "decode":
                    box.offers = partial(driver.reported.due, r.index)
                    box.take = partial(driver.take, r.index)
        return driver

    def _arrived(self, t) -> None:  # noqa: ANN001 - a Transfer whose KV is in
        dst = self.cluster.replicas[t.dst]
        self.inboxes[t.dst].push_import(t.request, dst.scheduler)
        self.inboxes[t.src].freed()  # its blocks are back: waiting requests may fit now
        self._maybe_done()

    def _backend(self, setup: ReplicaSetup, replica: Replica, pipelined: bool):  # noqa: ANN202
        """The replica's SimBackend, observed when a step's end matters to someone (the
        replica's predictor or history, or sessions waiting for a turn to finish)."""
        device = None if setup.device is None else self.devices[setup.device]
        event = setup.config.step_mode == "event"
        sim = SimBackend(setup.cost_model, event, self.clock, pipelined, device)
        self._sims.append(sim)
        counts = self.autoscale is not None and self.autoscale.measures_slo
        if not (replica.needs_steps or self.release.open or counts):
            return sim
        return ObservedBackend(sim, self.clock, self._observer(replica))

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> ClusterRecords:
        env = self.env
        env.process(self._arrivals())
        if self.autoscale is not None:
            for proc in self.autoscale.processes():
                env.process(proc)
        procs = [
            env.process(self._replica(r, b, box))
            for r, b, box in zip(self.cluster.replicas, self.backends, self.inboxes)
        ]
        # The run and its records allocate millions of short-lived objects and no garbage
        # cycles; the cyclic collector would only rescan the heap (16 pools, every request).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run(until=simpy.AllOf(env, procs))
            return self._records()
        finally:
            if was_enabled:
                gc.enable()

    def _replica(self, replica: Replica, backend, inbox: Inbox):  # noqa: ANN202
        sched, every = replica.scheduler, self.check_every
        hook = None if self.transfers is None else self.transfers.after_update(replica.index)
        check = self._check(replica)
        yield from serve(
            sched, backend, inbox, self.clock, self.end, every, check=check, after_update=hook
        )
        if replica.role == "prefill":
            self._prefill_loops -= 1
            self._maybe_done()

    def _check(self, replica: Replica):  # noqa: ANN202
        def check() -> None:  # after a step's update: the replica, the router, the routing
            replica.check_integrity()
            self.cluster.router.check_integrity()
            for d in self.devices.values():
                d.check_integrity()
            if self.transfers is not None:
                self.transfers.check_integrity()
            if self.autoscale is not None:
                self.autoscale.check_integrity()

        return check

    def _arrivals(self):  # noqa: ANN202 - a SimPy process
        env = self.env
        for r in self.open_loop:
            if r.arrival_time > self.end:
                break
            dt = r.arrival_time - env.now
            if dt > 0:
                yield env.timeout(dt)
            self._route(r)
        for r in self.release.first_turns():
            self._later(r)
        self._open_loop_done = True
        self._maybe_done()

    def _later(self, r: Request) -> None:
        if r.arrival_time > self.end:
            self.release.dropped(r)
            return
        self.env.process(self._arrive_at(r))

    def _arrive_at(self, r: Request):  # noqa: ANN202 - a SimPy process
        dt = r.arrival_time - self.env.now
        if dt > 0:
            yield self.env.timeout(dt)
        self._route(r)

    def _route(self, r: Request) -> None:
        i = self.cluster.route(r, self.env.now)
        sched = self.cluster.replicas[i].scheduler
        self.inboxes[i].push(r, sched)
        if self.release.open and sched.never_fits(r):
            # Rejected there (``add``), reported in that replica's next plan, which never comes
            # if it has nothing else to run (a decode replica that a turn too big for every
            # decode pool is routed to): the session ends now, not never.
            self.release.dropped(r)
            self._maybe_done()

    def _observer(self, replica: Replica):  # noqa: ANN202
        release, scaler = self.release, self.autoscale
        if scaler is not None and not scaler.measures_slo:
            scaler = None
        recorder, index = replica.scheduler.recorder, replica.index

        def on_step(plan: StepPlan, result: StepResult, end: float) -> None:
            if replica.needs_steps:
                replica.observe_step(plan, result, end)
            if scaler is not None:
                for r in result.finished:
                    scaler.finished(r, recorder, plan.step, index)
            if release.open:
                for r in result.finished:
                    nxt = release.finished(r, end)
                    if nxt is not None:
                        self._later(nxt)
                for r, _ in plan.rejected:
                    release.dropped(r)
                self._maybe_done()

        return on_step

    def _maybe_done(self) -> None:
        """Sources closed: close every inbox; a decode replica's only once no prefill replica
        runs and no handoff is pending or in flight."""
        if not (self._open_loop_done and self.release.done):
            return
        handoffs = self.cluster.handoffs
        feeding = handoffs is not None and (self._prefill_loops > 0 or not handoffs.idle)
        for rep, box in zip(self.cluster.replicas, self.inboxes):
            if not (feeding and rep.role == "decode"):
                box.close()

    def _records(self) -> ClusterRecords:
        now = self.env.now
        parts = []
        for rep, box in zip(self.cluster.replicas, self.inboxes):
            box.admit(rep.scheduler, now)  # routed, never reached the loop (cut by max_time)
            rep.scheduler.finish_run()
            rep.scheduler.check_integrity()
            parts.append(rep.scheduler.recorder.build())
        for d in self.devices.values():
            d.check_integrity()
        size = max(self.all_ids, default=-1) + 1
        assignment = np.full(size, -1, dtype=np.int64)
        routed = self.cluster.assignment
        assignment[np.fromiter(routed.keys(), np.int64, len(routed))] = np.fromiter(
            routed.values(), np.int64, len(routed)
        )
        names = tuple(r.name for r in self.cluster.replicas)
        handoffs = self.cluster.handoffs
        transfers = None if handoffs is None else handoffs.table()
        wall = self.cluster.route_wall_s + (0.0 if handoffs is None else handoffs.route_wall_s)
        fleet = None if self.autoscale is None else self.autoscale.summary(now)
        return ClusterRecords(tuple(parts), assignment, wall, names, transfers, fleet)


class Inbox:
    """A replica's arrivals: requests the router sent it, handed to its scheduler at once, or
    (``hold``) at the loop's next step boundary; exhausted once the cluster's sources close and
    its scheduler holds no blocks for a transfer (they come back when the transfer is done)."""

    def __init__(self, env: simpy.Environment, hold: bool, sched: Scheduler) -> None:
        self.env = env
        self.sched = sched
        self.hold = hold
        self.held: list[Request] = []
        self.imports: list[Request] = []  # held: handed-off requests whose KV is in
        self.fresh = False  # the scheduler changed since the loop last admitted (a transfer)
        self.closed = False
        self._wake: simpy.Event | None = None
        self.offers: Callable[[float], bool] | None = None  # reported placement: imports due
        self.take: Callable[[float], None] | None = None  # ... taken at a step boundary

    def push(self, r: Request, sched: Scheduler) -> None:
        if self.hold:
            self.held.append(r)
        else:
            sched.add(r)
        self._notify()

    def push_import(self, r: Request, sched: Scheduler) -> None:
        """``r``'s KV has arrived here (disaggregation): the scheduler admits it, at once or at
        the loop's next step boundary."""
        if self.hold:
            self.imports.append(r)
        else:
            sched.finish_import(r)
            self.fresh = True
        self._notify()

    def close(self) -> None:
        self.closed = True
        self._notify()

    def freed(self) -> None:
        """Blocks held for a transfer were released: the loop plans again."""
        self.fresh = True
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    wake = _notify

    def admit(self, sched: Scheduler, now: float) -> None:
        if self.take is not None:
            self.take(now)
        self.fresh = False
        if self.imports:
            for r in self.imports:
                sched.finish_import(r)
            self.imports.clear()
        if self.held:
            for r in self.held:
                sched.add(r)
            self.held.clear()

    def due(self, now: float) -> bool:
        if self.offers is not None and self.offers(now):
            return True
        return bool(self.held or self.imports) or self.fresh

    @property
    def exhausted(self) -> bool:
        return self.closed and not self.held and not self.imports and not self.sched.num_handed_off

    def wait(self, now: float, end: float) -> simpy.Event:
        self._wake = self.env.event()
        if self.exhausted:
            self._wake.succeed()
        return self._wake
