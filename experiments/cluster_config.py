"""Typed schema of a cluster run (``configs/cluster_run.yaml``, groups ``cluster/`` and
``router/``), merged by hydra and built into frozen dataclasses whose checks name the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experiments.cluster_setup import ReplicaSpec

KINDS = ("first_turn", "shared_prefix", "sessions")


@dataclass(frozen=True)
class ClusterSpec:
    """``replicas`` copies of ``replica``; ``overrides`` maps a replica index (as a string) to
    the ReplicaSpec fields it changes (a heterogeneous cluster); ``view_delay`` in seconds."""

    replicas: int = 4
    replica: ReplicaSpec = field(default_factory=ReplicaSpec)
    overrides: dict[str, Any] = field(default_factory=dict)
    view_delay: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"cluster.replicas must be an int >= 1, got {self.replicas!r}")
        bad = [k for k in self.overrides if not (k.isdigit() and int(k) < self.replicas)]
        if bad:
            raise ValueError(
                f"cluster.overrides: keys must be replica indices < {self.replicas}, got {bad}"
            )
        if not self.view_delay >= 0:
            raise ValueError(f"cluster.view_delay must be >= 0, got {self.view_delay!r}")

    def specs(self) -> list[ReplicaSpec]:
        from dataclasses import asdict

        base = asdict(self.replica)
        return [
            ReplicaSpec(**{**base, **dict(self.overrides.get(str(i), {}))})
            for i in range(self.replicas)
        ]


@dataclass(frozen=True)
class RouterSpec:
    name: str = "least_loaded"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterRunConfig:
    """One simulated cluster run. ``traffic``: first_turn, shared_prefix or sessions;
    ``load``: req/s per replica (sessions: session starts/s); SLO in seconds."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    router: RouterSpec = field(default_factory=RouterSpec)
    traffic: str = "first_turn"
    load: float = 55.0
    seed: int = 0
    requests: int = 4000
    sessions: int = 3000
    slo_ttft: float = 1.0
    slo_itl: float = 0.05

    def __post_init__(self) -> None:
        if self.traffic not in KINDS:
            raise ValueError(f"traffic must be one of {', '.join(KINDS)}, got {self.traffic!r}")
        if not self.load > 0:
            raise ValueError(f"load must be > 0, got {self.load!r}")
