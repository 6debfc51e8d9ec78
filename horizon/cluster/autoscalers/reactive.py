"""``reactive``: thresholds with hysteresis on a measured signal; Kubernetes HPA's rule by default.

Signals (each grows with load, so "above ``up``" always means "too little capacity"):

* ``utilization``: waiting plus running requests per replica over ``target_per_replica``;
* ``kv``: KV blocks held over the pool, averaged over replicas (vLLM's ``kv_cache_usage_perc``);
* ``queue``: waiting requests per replica (vLLM's ``num_requests_waiting``, the signal GKE's
  LLM autoscaling guide recommends);
* ``slo``: the share of last interval's finished requests that missed their SLO,
  ``1 - slo_attainment`` (an interval where nothing finished and no replica holds a request
  reads 0; one where nothing finished but requests are in flight gives no reading).

The rule, once per interval:

* scale up when the signal is above ``up`` for ``up_intervals`` consecutive intervals; scale
  down when it is below ``down`` for ``down_intervals``; the band between is the hysteresis,
  where nothing moves. After a move both streaks restart, and no move follows within
  ``cooldown_s``;
* the size of a move: ``step`` replicas (``sizing="step"``), or HPA's proportional rule
  (``"proportional"``): ``ceil(current * signal / target)``, which is ``ceil(total / target)``
  with the total summed over active replicas. Scaling up, the signal is averaged over active
  *and starting* replicas, the starting ones counted idle (HPA counts not-yet-ready pods at 0
  when scaling up), so a fleet waiting for its new replicas does not scale again; scaling down,
  the size is the highest recommendation of the last ``down_intervals`` intervals (HPA's
  scale-down stabilization window). A move up is at most ``max(max_up_ratio * current,
  current + max_up_replicas)``.

Defaults are HPA's (``autoscaling/v2``): tolerance 0.1 around the target (``up = 1.1 target``,
``down = 0.9 target``), scale-up with no stabilization (``up_intervals=1``) and at most double
or +4 pods per period, scale-down stabilization 300 s (``down_intervals=20`` at HPA's 15 s sync
period), no cooldown. Targets: utilization 1.0 (the load ``target_per_replica``), kv 0.8 (our
choice), queue 5 waiting per replica (the AverageValue common vLLM HPA/KEDA guides use), slo a
5% miss rate (up above 10%, down below 1%: attainment saturates at 100% long before a fleet is
over-provisioned), moved by steps (a proportional rule on a miss rate would scale an idle fleet
to zero).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol, cast

from horizon.cluster.autoscaler import Autoscaler, FleetView, ceil_count, check_now

SIGNALS = ("utilization", "kv", "queue", "slo")
SIZINGS = ("proportional", "step")


@dataclass(frozen=True)
class SignalDefault:
    """A policy's defaults for one signal. Given another ``target``, ``up`` and ``down`` keep
    their ratios to it."""

    target: float
    up: float
    down: float
    sizing: str

    def band(self, target: float) -> tuple[float, float]:
        """``(up, down)`` for ``target``."""
        if target == self.target:
            return self.up, self.down
        return target * self.up / self.target, target * self.down / self.target


REACTIVE_DEFAULTS: Mapping[str, SignalDefault] = MappingProxyType(
    {
        "utilization": SignalDefault(1.0, 1.1, 0.9, "proportional"),
        "kv": SignalDefault(0.8, 0.88, 0.72, "proportional"),
        "queue": SignalDefault(5.0, 5.5, 4.5, "proportional"),
        "slo": SignalDefault(0.05, 0.10, 0.01, "step"),
    }
)


@dataclass(frozen=True)
class ReactiveConfig:
    """A reactive autoscaler's resolved knobs (see the module docstring); checked on
    construction, each error naming its field."""

    signal: str
    target: float
    up: float
    down: float
    target_per_replica: float
    up_intervals: int
    down_intervals: int
    sizing: str
    step: int
    cooldown_s: float
    max_up_ratio: float
    max_up_replicas: int

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if self.sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {', '.join(SIZINGS)}, got {self.sizing!r}")
        for name in ("target", "target_per_replica"):
            _positive(name, getattr(self, name))
        _positive("max_up_ratio", self.max_up_ratio)
        if self.max_up_ratio < 1:
            raise ValueError(f"max_up_ratio must be >= 1, got {self.max_up_ratio!r}")
        for name in ("down", "cooldown_s"):
            _positive(name, getattr(self, name), strict=False)
        _positive("up", self.up)
        if not self.up > self.down:
            raise ValueError(f"up must be > down ({self.down!r}), got {self.up!r}")
        for name in ("up_intervals", "down_intervals", "step", "max_up_replicas"):
            _whole(name, getattr(self, name), 1)
        if self.sizing == "proportional":
            if self.signal == "slo":
                raise ValueError("sizing 'proportional' needs a load signal, not 'slo'; use 'step'")
            if not self.down <= self.target <= self.up:
                raise ValueError(
                    f"target must lie in [down, up] = [{self.down!r}, {self.up!r}] for "
                    f"proportional sizing, got {self.target!r}"
                )


def _positive(name: str, v: object, strict: bool = True) -> None:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or v < 0
        or (strict and v == 0)
    ):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {v!r}")


def _whole(name: str, v: object, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


class _Counts(Protocol):
    """What ``measure`` reads of a ``ReplicaView`` (whose attributes only its docstring
    declares, so a type checker needs this)."""

    num_waiting: int
    num_running: int
    kv_used_blocks: int
    num_blocks: int


def measure(signal: str, view: FleetView, target_per_replica: float) -> tuple[float, float] | None:
    """The signal's reading ``(for scaling up, for scaling down)``, or None without one.

    Load signals sum over the active replicas; the up reading divides by active plus starting
    replicas, the down reading by active ones. No active replica: None. Changes nothing.
    """
    if view.active == 0:
        return None
    reps = cast("Sequence[_Counts]", view.replicas)
    if signal == "slo":
        if view.slo_attainment is None:
            idle = all(v.num_waiting + v.num_running == 0 for v in reps)
            return (0.0, 0.0) if idle else None
        miss = 1.0 - view.slo_attainment
        return miss, miss
    if signal == "utilization":
        total = sum(v.num_waiting + v.num_running for v in reps) / target_per_replica
    elif signal == "kv":
        total = sum(min(1.0, v.kv_used_blocks / v.num_blocks) for v in reps)
    else:
        total = float(sum(v.num_waiting for v in reps))
    return total / view.current, total / view.active


class Reactive(Autoscaler):
    """Thresholds with hysteresis (see the module docstring); HPA's rule by default.

    Args:
        signal: ``utilization``, ``kv``, ``queue`` or ``slo``.
        target: the signal's target (None: the signal's default, see the module docstring).
        up, down: the band's edges (None: ``target * 1.1`` and ``target * 0.9``, HPA's
            tolerance; slo: 0.10 and 0.01).
        target_per_replica: waiting plus running requests one replica should hold (the
            ``utilization`` signal's unit; 32 is our choice: set it from a capacity sweep).
        up_intervals, down_intervals: consecutive intervals beyond an edge before a move
            (1 and 20; None for ``down_intervals``: 20, HPA's 300 s at a 15 s sync period).
        sizing: ``proportional`` (HPA) or ``step`` (None: proportional, step for slo).
        step: replicas a step move adds or removes.
        cooldown_s: seconds after a move in which no other move is made.
        max_up_ratio, max_up_replicas: a move up reaches at most
            ``max(ceil(max_up_ratio * current), current + max_up_replicas)`` (HPA: 2 and 4).

    Raises:
        ValueError: a knob out of range, naming it (``reactive.up must ...``).
    """

    name = "reactive"
    DEFAULTS: ClassVar[Mapping[str, SignalDefault]] = REACTIVE_DEFAULTS
    DOWN_INTERVALS: ClassVar[int] = 20

    def __init__(
        self,
        signal: str = "utilization",
        target: float | None = None,
        up: float | None = None,
        down: float | None = None,
        target_per_replica: float = 32.0,
        up_intervals: int = 1,
        down_intervals: int | None = None,
        sizing: str | None = None,
        step: int = 1,
        cooldown_s: float = 0.0,
        max_up_ratio: float = 2.0,
        max_up_replicas: int = 4,
    ) -> None:
        if signal not in self.DEFAULTS:
            raise ValueError(
                f"{self.name}.signal must be one of {', '.join(SIGNALS)}, got {signal!r}"
            )
        d = self.DEFAULTS[signal]
        t = d.target if target is None else target
        try:
            _positive("target", t)
            up_d, down_d = d.band(t)
            self.config = ReactiveConfig(
                signal=signal,
                target=t,
                up=up_d if up is None else up,
                down=down_d if down is None else down,
                target_per_replica=target_per_replica,
                up_intervals=up_intervals,
                down_intervals=self.DOWN_INTERVALS if down_intervals is None else down_intervals,
                sizing=d.sizing if sizing is None else sizing,
                step=step,
                cooldown_s=cooldown_s,
                max_up_ratio=max_up_ratio,
                max_up_replicas=max_up_replicas,
            )
        except ValueError as e:
            raise ValueError(f"{self.name}.{e}") from None
        self._above = 0  # consecutive intervals above ``up``
        self._below = 0  # consecutive intervals below ``down``
        self._recs: deque[int] = deque(maxlen=self.config.down_intervals)  # proportional sizes
        self._last_move: float | None = None
        self._last_now: float | None = None

    def decide(self, view: FleetView) -> int:
        """Update the streaks with this interval's reading, then move if one is long enough
        (see the module docstring). Without a reading the fleet holds and the streaks restart;
        with no replica active or starting, one replica is wanted as soon as a request arrived
        in the last interval (scale from zero on demand)."""
        self._last_now = check_now(self.name, self._last_now, view.now)
        cfg, current = self.config, view.current
        if current == 0:
            self._above = self._below = 0
            return view.clamp(1 if view.arrivals and view.arrivals[-1] > 0 else 0)
        reading = measure(cfg.signal, view, cfg.target_per_replica)
        if reading is None:
            self._above = self._below = 0
            return view.clamp(current)
        up_v, down_v = reading
        self._above = self._above + 1 if up_v > cfg.up else 0
        self._below = self._below + 1 if down_v < cfg.down else 0
        if cfg.sizing == "proportional":  # HPA's recommendation: ceil(total / target)
            self._recs.append(ceil_count(down_v * view.active / cfg.target))
        if self._last_move is not None and view.now < self._last_move + cfg.cooldown_s:
            return view.clamp(current)
        if self._above >= cfg.up_intervals:
            desired = view.clamp(self._up_size(current))
        elif self._below >= cfg.down_intervals:
            desired = view.clamp(self._down_size(current))
        else:
            return view.clamp(current)
        if desired != current:
            self._above = self._below = 0
            self._recs.clear()
            self._last_move = view.now
        return desired

    def _up_size(self, current: int) -> int:
        cfg = self.config
        n = current + cfg.step if cfg.sizing == "step" else max(current + 1, self._recs[-1])
        cap = max(math.ceil(cfg.max_up_ratio * current), current + cfg.max_up_replicas)
        return min(n, cap)

    def _down_size(self, current: int) -> int:
        if self.config.sizing == "step":
            return current - self.config.step
        return min(current, max(self._recs))  # the highest recommendation in the window

    def check_integrity(self) -> None:
        assert self._above >= 0 and self._below >= 0
        assert len(self._recs) <= self.config.down_intervals
        assert all(r >= 0 for r in self._recs)
        assert self._last_move is None or (
            self._last_now is not None and self._last_move <= self._last_now
        )
