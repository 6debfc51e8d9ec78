"""``predictive``: provision for the arrival rate forecast at the time a replica started now
becomes routable.

Holt's linear exponential smoothing (level and trend) runs over the view's arrival counts,
oldest first: ``level_0 = x_0``, ``trend_0 = x_1 - x_0`` (a single count: no trend), then for
each later count ``x``

    level' = alpha * x + (1 - alpha) * (level + trend)
    trend' = beta * (level' - level) + (1 - beta) * trend

and the count ``h`` intervals ahead is ``level + h * trend`` (never below 0). A replica started
now is routable ``startup_delay_s`` later and then serves the next whole interval, so
``h = 1 + startup_delay_s / interval_s`` (one interval ahead with no start-up delay). Then

    desired = ceil(forecast_rate / per_replica_capacity * (1 + headroom))

Scaling up is immediate; scaling down takes the highest recommendation of the last
``stabilization_s`` seconds (Kubernetes HPA's scale-down stabilization, 300 s by default), the
fleet size found at the first decision counting as a recommendation, so nothing is removed
before a whole window has been seen. The smoothing is recomputed from the view each interval,
so the forecast depends only on the history the caller keeps, not on earlier calls.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from horizon.cluster.autoscaler import Autoscaler, FleetView, ceil_count, check_now


def holt_forecast(series: Sequence[float], alpha: float, beta: float, steps: float) -> float:
    """Holt's forecast ``steps`` (may be fractional) past the last value of ``series``.

    Raises:
        ValueError: ``series`` is empty.
    """
    if not series:
        raise ValueError("holt_forecast needs at least one value")
    level = float(series[0])
    trend = float(series[1]) - level if len(series) > 1 else 0.0
    for x in series[1:]:
        prev = level
        level = alpha * x + (1.0 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1.0 - beta) * trend
    return level + steps * trend


@dataclass(frozen=True)
class PredictiveConfig:
    """A predictive autoscaler's knobs (see ``Predictive``); checked on construction."""

    per_replica_capacity: float
    alpha: float = 0.5
    beta: float = 0.3
    headroom: float = 0.1
    stabilization_s: float = 300.0

    def __post_init__(self) -> None:
        checks = (
            ("per_replica_capacity", self.per_replica_capacity, lambda v: v > 0, "> 0"),
            ("alpha", self.alpha, lambda v: 0 < v <= 1, "in (0, 1]"),
            ("beta", self.beta, lambda v: 0 <= v <= 1, "in [0, 1]"),
            ("headroom", self.headroom, lambda v: v >= 0, ">= 0"),
            ("stabilization_s", self.stabilization_s, lambda v: v >= 0, ">= 0"),
        )
        for name, v, within, bound in checks:
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not number or not within(v):
                raise ValueError(f"{name} must be a finite number {bound}, got {v!r}")


class Predictive(Autoscaler):
    """Forecast-driven provisioning (see the module docstring).

    Args:
        per_replica_capacity: requests per second one replica sustains at the SLO (required:
            measure it, e.g. the goodput knee of a single-replica rate sweep).
        alpha: level smoothing in (0, 1] (0.5: our choice, tracks a ramp within a few
            intervals; there is no standard value, statistics packages fit it).
        beta: trend smoothing in [0, 1] (0.3: our choice likewise; 0 freezes the first trend).
        headroom: capacity kept above the forecast, a share (0.1).
        stabilization_s: seconds of recommendations a scale-down takes the highest of (300,
            HPA's default; 0: scale down at once).

    Raises:
        ValueError: a knob out of range, naming it (``predictive.alpha must ...``).
    """

    name = "predictive"

    def __init__(
        self,
        per_replica_capacity: float,
        alpha: float = 0.5,
        beta: float = 0.3,
        headroom: float = 0.1,
        stabilization_s: float = 300.0,
    ) -> None:
        try:
            self.config = PredictiveConfig(
                per_replica_capacity, alpha, beta, headroom, stabilization_s
            )
        except ValueError as e:
            raise ValueError(f"{self.name}.{e}") from None
        self._window: deque[tuple[float, int]] = deque()  # (time, recommendation), oldest first
        self._last_now: float | None = None

    def forecast_rate(self, view: FleetView) -> float | None:
        """Arrivals per second forecast for the first interval a replica started now serves
        (None without arrival history). Changes nothing."""
        if not view.arrivals:
            return None
        cfg = self.config
        steps = 1.0 + view.startup_delay_s / view.interval_s
        count = holt_forecast(view.arrivals, cfg.alpha, cfg.beta, steps)
        return max(0.0, count) / view.interval_s

    def decide(self, view: FleetView) -> int:
        """Up at once to the forecast's need; down only to the highest recommendation of the
        stabilization window. Without arrival history the fleet holds."""
        self._last_now = check_now(self.name, self._last_now, view.now)
        current = view.current
        if not self._window:
            self._window.append((view.now, view.clamp(current)))  # the fleet as found
        rate = self.forecast_rate(view)
        if rate is None:
            return view.clamp(current)
        cfg = self.config
        rec = view.clamp(ceil_count(rate / cfg.per_replica_capacity * (1.0 + cfg.headroom)))
        self._window.append((view.now, rec))
        while self._window[0][0] < view.now - cfg.stabilization_s:
            self._window.popleft()
        if rec >= current:
            return rec
        return view.clamp(min(current, max(r for _, r in self._window)))

    def check_integrity(self) -> None:
        times = [t for t, _ in self._window]
        assert times == sorted(times)
        assert all(r >= 0 for _, r in self._window)
        assert not times or (self._last_now is not None and times[-1] <= self._last_now)
