"""Autoscaling on the simulated clock: an ``Autoscaler`` decides every interval; the fleet follows.

The cluster holds ``max_replicas`` replicas; ``horizon.cluster.fleet.Fleet`` keeps which are
provisioned. Every ``interval_s`` the driver makes due starting replicas routable and stops
drained ones (``Fleet.tick``), builds a ``FleetView`` (active replicas' views, arrivals per
past interval, counts) and applies the autoscaler's decision (``Fleet.apply``). A started
replica becomes routable exactly ``startup_delay_s`` later (its own wake-up), so a start-up
delay need not be a multiple of the interval. ``slo_attainment`` is not provided (None):
the built-in signals read queues, KV and arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from horizon.cluster import Cluster, FleetView
from horizon.cluster.autoscaler import Autoscaler
from horizon.cluster.fleet import Fleet


@dataclass(frozen=True)
class AutoscaleConfig:
    """Autoscaling's settings: decision ``interval_s``, ``startup_delay_s`` from a start to
    routable, ``min_replicas``, replicas active at time 0 (``initial``), and how many past
    intervals of arrivals a view carries (``history``). The most replicas is the cluster's
    size."""

    interval_s: float = 15.0
    startup_delay_s: float = 30.0
    min_replicas: int = 1
    initial: int = 1
    history: int = 40

    def __post_init__(self) -> None:
        for name in ("interval_s", "startup_delay_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"AutoscaleConfig.{name} must be a number >= 0, got {v!r}")
        if self.interval_s <= 0:
            raise ValueError(f"AutoscaleConfig.interval_s must be > 0, got {self.interval_s!r}")
        if not (isinstance(self.history, int) and self.history >= 2):
            raise ValueError(f"AutoscaleConfig.history must be an int >= 2, got {self.history!r}")


class AutoscaleDriver:
    """Runs ``autoscaler`` over ``cluster`` on ``env`` (see the module docstring)."""

    def __init__(
        self, env: simpy.Environment, cluster: Cluster, autoscaler: Autoscaler, cfg: AutoscaleConfig
    ) -> None:
        self.env, self.cluster, self.autoscaler, self.cfg = env, cluster, autoscaler, cfg
        self.fleet = Fleet(cluster, cfg.startup_delay_s, cfg.initial, cfg.min_replicas)
        self.arrivals: list[int] = []
        self._routed = 0
        self.decisions: list[tuple[float, int]] = []

    def run(self):  # noqa: ANN201 - a SimPy process
        env, cfg = self.env, self.cfg
        while True:
            yield env.timeout(cfg.interval_s)
            self._decide(env.now)

    def _decide(self, now: float) -> None:
        fleet, cluster = self.fleet, self.cluster
        fleet.tick(now)
        routed = cluster.num_routed
        self.arrivals.append(routed - self._routed)
        self._routed = routed
        del self.arrivals[: -self.cfg.history]
        active = [i for i, s in enumerate(fleet.state) if s == "active"]
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
