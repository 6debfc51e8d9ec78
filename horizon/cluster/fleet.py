"""Which of a cluster's replicas are provisioned, and the autoscaler's decisions applied to them.

A replica is in one of four states:

    standby    not provisioned (no GPU time); not routable
    starting   provisioned at ``started``, routable from ``ready`` = started + start-up delay
    active     routable
    draining   provisioned, not routable: it finishes the requests it holds, then stops

``apply(desired, now)`` moves the fleet toward ``desired`` replicas (active plus starting):
up, it first takes back draining replicas (warm, at once), then starts standby ones; down, it
drains starting replicas first (the latest started), then the active replicas holding the
fewest requests. ``tick(now)`` makes due starting replicas active and stops drained ones that
hold nothing (no request running or waiting, none handed off to a decode replica and not yet
copied, none being imported). Only routable replicas are offered to the routers
(``Cluster.set_routable``; a decode replica to the decode router). GPU time is counted from a
replica's start to its stop (``gpu_seconds``).

A fleet manages a ``pool`` of the cluster's replicas, all of one role: a disaggregated cluster
scales its prefill and its decode replicas as two fleets, each with its own autoscaler.
"""

from __future__ import annotations

from horizon.cluster.cluster import Cluster

STATES = ("standby", "starting", "active", "draining")


class Fleet:
    """The provisioning state of ``cluster``'s replicas (see the module docstring).

    Args:
        cluster: the cluster (its replicas are the fleet's, ``max_replicas`` of them).
        startup_delay_s: seconds from a start to routable.
        initial: replicas active at time 0 (the rest standby).
        min_replicas: never fewer active plus starting (>= 1: the router needs a replica).
        pool: the indices of the cluster's replicas this fleet manages, all of one role
            (default: every replica); ``max_replicas`` is their number. State lists below are
            in pool order.
    """

    def __init__(
        self,
        cluster: Cluster,
        startup_delay_s: float,
        initial: int,
        min_replicas: int = 1,
        pool: tuple[int, ...] | None = None,
    ) -> None:
        self.pool = tuple(range(len(cluster.replicas))) if pool is None else tuple(pool)
        n = len(self.pool)
        if not (isinstance(startup_delay_s, (int, float)) and startup_delay_s >= 0):
            raise ValueError(f"Fleet.startup_delay_s must be >= 0, got {startup_delay_s!r}")
        if not (isinstance(min_replicas, int) and 1 <= min_replicas <= n):
            raise ValueError(f"Fleet.min_replicas must be an int in 1..{n}, got {min_replicas!r}")
        if not (isinstance(initial, int) and min_replicas <= initial <= n):
            lo = min_replicas
            raise ValueError(f"Fleet.initial must be an int in {lo}..{n}, got {initial!r}")
        roles = {cluster.replicas[i].role for i in self.pool}
        if len(roles) != 1:
            raise ValueError(f"Fleet.pool: replicas of one role, got {sorted(roles)}")
        self.role = roles.pop()
        self.cluster = cluster
        self.startup_delay_s = float(startup_delay_s)
        self.min_replicas = min_replicas
        self.state = ["active"] * initial + ["standby"] * (n - initial)
        self.ready = [0.0] * n
        self.started = [0.0 if i < initial else -1.0 for i in range(n)]
        self.gpu_seconds = 0.0
        self.timeline: list[tuple[float, int, int, int]] = [(0.0, initial, 0, 0)]
        for j, i in enumerate(self.pool):
            cluster.set_routable(i, j < initial)

    def count(self, state: str) -> int:
        return sum(1 for s in self.state if s == state)

    @property
    def max_replicas(self) -> int:
        return len(self.state)

    def apply(self, desired: int, now: float) -> None:
        """Move toward ``desired`` (clamped to [min_replicas, max_replicas]) active + starting."""
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        current = self.count("active") + self.count("starting")
        for _ in range(desired - current):
            self._up(now)
        for _ in range(current - desired):
            self._down(now)
        self._mark(now)

    def _up(self, now: float) -> None:
        draining = [i for i, s in enumerate(self.state) if s == "draining"]
        if draining:
            i = draining[-1]
            self.state[i] = "active"
            self.cluster.set_routable(self.pool[i], True)
            return
        i = self.state.index("standby")
        self.state[i], self.started[i] = "starting", now
        self.ready[i] = now + self.startup_delay_s

    def _down(self, now: float) -> None:
        starting = [i for i, s in enumerate(self.state) if s == "starting"]
        if starting:
            i = max(starting, key=lambda j: (self.started[j], j))
            self.state[i] = "standby"  # never became routable: its start is cancelled
            self.gpu_seconds += now - self.started[i]
            return
        active = [i for i, s in enumerate(self.state) if s == "active"]
        i = min(active, key=lambda j: (self._held(j), -j))
        self.state[i] = "draining"
        self.cluster.set_routable(self.pool[i], False)

    def _held(self, i: int) -> int:
        s = self.cluster.replicas[self.pool[i]].scheduler
        return len(s.running) + s.num_waiting

    def _drained(self, i: int) -> bool:
        s = self.cluster.replicas[self.pool[i]].scheduler
        return not (s.has_work or s.num_handed_off or s.num_importing)

    def tick(self, now: float) -> None:
        """Starting replicas that are due become active; drained replicas stop."""
        for i, s in enumerate(self.state):
            if s == "starting" and self.ready[i] <= now:
                self.state[i] = "active"
                self.cluster.set_routable(self.pool[i], True)
            elif s == "draining" and self._drained(i):
                self.state[i] = "standby"
                self.gpu_seconds += now - self.started[i]
        self._mark(now)

    def _mark(self, now: float) -> None:
        row = (now, self.count("active"), self.count("starting"), self.count("draining"))
        if row[1:] != self.timeline[-1][1:]:
            self.timeline.append(row)

    def close(self, now: float) -> float:
        """GPU-seconds at the run's end ``now``: stopped replicas' time plus every provisioned
        replica's time so far (the states are left as they are)."""
        live = sum(now - self.started[i] for i, s in enumerate(self.state) if s != "standby")
        return self.gpu_seconds + live

    def check_integrity(self) -> None:
        assert all(s in STATES for s in self.state)
        assert self.gpu_seconds >= 0
        for i, s in zip(self.pool, self.state):
            assert self.cluster.routable[i] == (s == "active"), f"replica {i}: {s} routable?"
