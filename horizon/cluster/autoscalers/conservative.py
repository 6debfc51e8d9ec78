"""``conservative``: scale up early, scale down late. The reactive rule with asymmetric knobs
for fleets where a missed SLO costs more than an idle replica (GPU start-up takes minutes):

* up early: a low up edge, acted on at once (``up_intervals=1``), sized toward a low target, so
  the fleet runs with headroom;
* down late: a down edge far below the up edge (a wide band) and a long window
  (``down_intervals=40``, 600 s at a 15 s period: twice HPA's).

Per signal (target, up, down): utilization 0.6, 0.8, 0.4; kv 0.45, 0.6, 0.3; queue 1.5, 2, 1;
slo 2.5% miss, 5%, 0.5%. Each edge is at or below the reactive default's, each window at least
as long, so on the same readings it scales up no later and down no earlier.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from horizon.cluster.autoscalers.reactive import Reactive, SignalDefault

CONSERVATIVE_DEFAULTS: Mapping[str, SignalDefault] = MappingProxyType(
    {
        "utilization": SignalDefault(0.6, 0.8, 0.4, "proportional"),
        "kv": SignalDefault(0.45, 0.6, 0.3, "proportional"),
        "queue": SignalDefault(1.5, 2.0, 1.0, "proportional"),
        "slo": SignalDefault(0.025, 0.05, 0.005, "step"),
    }
)


class Conservative(Reactive):
    """The reactive rule (same knobs, see ``Reactive``) with early-up, late-down defaults:
    ``up`` and ``down`` at ``4/3`` and ``2/3`` of a lower target (slo: 5% and 0.5% miss),
    ``down_intervals=40``."""

    name = "conservative"
    DEFAULTS: ClassVar[Mapping[str, SignalDefault]] = CONSERVATIVE_DEFAULTS
    DOWN_INTERVALS: ClassVar[int] = 40
