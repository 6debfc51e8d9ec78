"""Autoscaling on the simulated clock: an ``Autoscaler`` decides every interval; the fleet follows.

The cluster holds ``max_replicas`` replicas; ``horizon.cluster.fleet.Fleet`` keeps which are
provisioned. Every ``interval_s`` the driver makes due starting replicas routable and stops
drained ones (``Fleet.tick``), builds a ``FleetView`` (active replicas' views, arrivals per
past interval, counts) and applies the autoscaler's decision (``Fleet.apply``). A started
replica becomes routable exactly ``startup_delay_s`` later (its own wake-up), so a start-up
delay need not be a multiple of the interval. ``slo_attainment``: with ``AutoscaleConfig.slo``
set, the share of the requests that finished in the past interval with their first token
within its TTFT and every gap within its ITL (a request's own ``slo`` where it has one; None
when none finished); without it, None.

A disaggregated cluster scales its prefill and its decode replicas as two pools
(``Autoscaling``: one driver, fleet and autoscaler each, settings per role): a pool's view
holds its own replicas, its ``arrivals`` count the requests routed to it (a decode pool's:
the handoffs placed on it), and its ``slo_attainment`` the requests that finished on it (a
prefill pool's: None, its requests finish elsewhere).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from horizon.cluster import Cluster, FleetView
from horizon.cluster.autoscaler import Autoscaler
from horizon.cluster.fleet import Fleet
from horizon.recorder import Recorder
from horizon.request import SLO, Request


@dataclass(frozen=True)
class AutoscaleConfig:
    """Autoscaling's settings: decision ``interval_s``, ``startup_delay_s`` from a start to
    routable, ``min_replicas``, replicas active at time 0 (``initial``), and how many past
    intervals of arrivals a view carries (``history``), and the ``slo`` by which views'
    ``slo_attainment`` is measured (None: not measured). The most replicas is the cluster's
    size."""

    interval_s: float = 15.0
    startup_delay_s: float = 30.0
    min_replicas: int = 1
    initial: int = 1
    history: int = 40
    slo: SLO | None = None

    def __post_init__(self) -> None:
        for name in ("interval_s", "startup_delay_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"AutoscaleConfig.{name} must be a number >= 0, got {v!r}")
        if self.interval_s <= 0:
            raise ValueError(f"AutoscaleConfig.interval_s must be > 0, got {self.interval_s!r}")
        if not (isinstance(self.history, int) and self.history >= 2):
            raise ValueError(f"AutoscaleConfig.history must be an int >= 2, got {self.history!r}")
        if self.slo is not None and not isinstance(self.slo, SLO):
            raise ValueError(f"AutoscaleConfig.slo must be an SLO or None, got {self.slo!r}")


class AutoscaleDriver:
    """Runs ``autoscaler`` over ``cluster`` on ``env`` (see the module docstring)."""

    def __init__(
        self,
        env: simpy.Environment,
        cluster: Cluster,
        autoscaler: Autoscaler,
        cfg: AutoscaleConfig,
        pool: tuple[int, ...] | None = None,
    ) -> None:
        self.env, self.cluster, self.autoscaler, self.cfg = env, cluster, autoscaler, cfg
        self.fleet = Fleet(cluster, cfg.startup_delay_s, cfg.initial, cfg.min_replicas, pool)
        self._members = tuple(cluster.replicas[i] for i in self.fleet.pool)
        self.arrivals: list[int] = []
        self._routed = 0
        # with ``cfg.slo``: requests whose finishing step has ended, not yet counted
        self._pending: list[tuple[Request, Recorder, int]] = []
        self.decisions: list[tuple[float, int]] = []

    @property
    def measures_slo(self) -> bool:
        return self.cfg.slo is not None

    def finished(self, req: Request, recorder: Recorder, step: int) -> None:
        """``req`` finished in step ``step`` (just ended) of the replica ``recorder``
        records; counted at the first decision after that step's update is recorded."""
        self._pending.append((req, recorder, step))

    def _attainment(self) -> float | None:
        """The met share of the pending requests whose last step is recorded (they leave)."""
        done, left = [], []
        for p in self._pending:
            (done if p[1].num_steps > p[2] else left).append(p)
        self._pending = left
        if not done:
            return None
        met = 0
        for req, recorder, _ in done:
            slo = req.slo or self.cfg.slo
            met += recorder.slo_met(req, slo.ttft, slo.itl)
        return met / len(done)

    def run(self):  # noqa: ANN201 - a SimPy process
        env, cfg = self.env, self.cfg
        while True:
            yield env.timeout(cfg.interval_s)
            self._decide(env.now)

    def _decide(self, now: float) -> None:
        fleet, cluster = self.fleet, self.cluster
        fleet.tick(now)
        routed = sum(r.routed + r.imported for r in self._members)
        self.arrivals.append(routed - self._routed)
        self._routed = routed
        del self.arrivals[: -self.cfg.history]
        active = [i for i, s in zip(fleet.pool, fleet.state) if s == "active"]
        view = FleetView(
            now=now,
            interval_s=self.cfg.interval_s,
            startup_delay_s=self.cfg.startup_delay_s,
            min_replicas=self.cfg.min_replicas,
            max_replicas=fleet.max_replicas,
            active=len(active),
            starting=fleet.count("starting"),
            draining=fleet.count("draining"),
            replicas=tuple(cluster.views[i] for i in active),
            arrivals=tuple(self.arrivals),
            slo_attainment=self._attainment() if self.measures_slo else None,
            role=fleet.role,
        )
        desired = self.autoscaler.decide(view)
        before = set(i for i, s in enumerate(fleet.state) if s == "starting")
        fleet.apply(desired, now)
        self.decisions.append((now, desired))
        for i, s in enumerate(fleet.state):
            if s == "starting" and i not in before:
                self.env.process(self._ready_at(fleet.ready[i]))

    def _ready_at(self, t: float):  # noqa: ANN202 - a SimPy process
        if t > self.env.now:
            yield self.env.timeout(t - self.env.now)
        self.fleet.tick(self.env.now)

    def summary(self, now: float) -> dict:
        """GPU-seconds provisioned (every replica's time from start to stop), the fleet's
        timeline (time, active, starting, draining) and the decisions."""
        return {
            "gpu_seconds": self.fleet.close(now),
            "timeline": [list(row) for row in self.fleet.timeline],
            "decisions": [list(d) for d in self.decisions],
        }

    def check_integrity(self) -> None:
        self.fleet.check_integrity()
        self.autoscaler.check_integrity()


class Autoscaling:
    """Every pool's ``AutoscaleDriver`` of one run: one pool of all replicas (mixed ones), or
    one per role of a disaggregated cluster.

    Args:
        autoscaler: an ``Autoscaler`` (mixed replicas), or one per role
            (``{"prefill": ..., "decode": ...}``: a fresh object each).
        cfg: an ``AutoscaleConfig``, or one per role (a role without one: the defaults).
    """

    def __init__(
        self,
        env: simpy.Environment,
        cluster: Cluster,
        autoscaler: Autoscaler | dict[str, Autoscaler],
        cfg: AutoscaleConfig | dict[str, AutoscaleConfig] | None,
    ) -> None:
        roles = sorted({r.role for r in cluster.replicas})
        scalers = autoscaler if isinstance(autoscaler, dict) else {"mixed": autoscaler}
        if sorted(scalers) != roles:
            raise ValueError(f"ClusterSimulation.autoscaler: one per role {roles}, got "
                             f"{sorted(scalers)}")  # fmt: skip
        if len({id(a) for a in scalers.values()}) != len(scalers):
            raise ValueError("ClusterSimulation.autoscaler: every role needs its own object")
        cfgs = cfg if isinstance(cfg, dict) else {role: cfg for role in roles}
        self.drivers: dict[str, AutoscaleDriver] = {}
        self._of: dict[int, AutoscaleDriver] = {}
        for role in roles:
            pool = tuple(i for i, r in enumerate(cluster.replicas) if r.role == role)
            c = cfgs.get(role) or AutoscaleConfig()
            d = self.drivers[role] = AutoscaleDriver(env, cluster, scalers[role], c, pool)
            self._of.update(dict.fromkeys(pool, d))

    @property
    def measures_slo(self) -> bool:
        return any(d.measures_slo for d in self.drivers.values())

    def finished(self, req: Request, recorder: Recorder, step: int, replica: int) -> None:
        """``req`` finished in step ``step`` on replica ``replica`` (its pool counts it)."""
        d = self._of[replica]
        if d.measures_slo:
            d.finished(req, recorder, step)

    def processes(self) -> list:
        return [d.run() for d in self.drivers.values()]

    def summary(self, now: float) -> dict:
        """One pool: its driver's summary; several: their GPU-seconds summed and each pool's
        summary under ``pools``."""
        if list(self.drivers) == ["mixed"]:
            return self.drivers["mixed"].summary(now)
        pools = {role: d.summary(now) for role, d in self.drivers.items()}
        return {"gpu_seconds": sum(p["gpu_seconds"] for p in pools.values()), "pools": pools}

    def check_integrity(self) -> None:
        for d in self.drivers.values():
            d.check_integrity()
