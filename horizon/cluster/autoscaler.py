"""The autoscaler interface: decisions only.

Once per interval the cluster hands an ``Autoscaler`` a ``FleetView``, a frozen snapshot of the
fleet (replica counts, read-only ``ReplicaView``s of the routable replicas, recent arrival
counts, last interval's SLO attainment), and ``decide(view)`` returns the **desired number of
replicas**, active plus starting. The caller clamps it to ``[min_replicas, max_replicas]`` and
starts or drains replicas to meet it; the autoscaler never touches a replica or the view.

Contract of every autoscaler:

* decisions only: ``decide`` reads the view and its own state, mutates neither the view (it is
  frozen) nor anything the view refers to;
* deterministic: the same sequence of views gives the same sequence of decisions (no clock, no
  unseeded randomness);
* ``decide`` is called once per interval with ``view.now`` non-decreasing; what it remembers
  between calls (streaks, past recommendations) is its own and ``check_integrity`` asserts it.

Autoscalers are registered by name (``horizon.cluster.autoscalers``) and also load from
``package.module:Class``; their constructor's keyword arguments are their knobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from horizon.cluster.view import ReplicaView

# A float quotient that should be a whole number (12 / 4 * 1.0) must not round up to the next.
_CEIL_EPS = 1e-9


def _count(name: str, v: object, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"FleetView.{name} must be an int >= {lo}, got {v!r}")


def _number(name: str, v: object, lo: float, positive: bool = False) -> None:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or v < lo
        or (positive and v <= lo)
    ):
        bound = f"> {lo}" if positive else f">= {lo}"
        raise ValueError(f"FleetView.{name} must be a finite number {bound}, got {v!r}")


@dataclass(frozen=True, slots=True)
class FleetView:
    """What an autoscaler may read about the fleet at one interval's end (read-only).

    Attributes:
        now: the decision time (s).
        interval_s: seconds between decisions (> 0); ``arrivals`` are counted per interval.
        startup_delay_s: seconds a replica started now takes before it is routable (>= 0).
        min_replicas, max_replicas: the bounds the caller clamps ``decide``'s answer to
            (0 <= min <= max, max >= 1).
        active: routable replicas.
        starting: started, not yet routable (they count toward the desired number).
        draining: stopping: no new requests, finishing their running ones (they do not count).
        replicas: one ``ReplicaView`` per active replica (``len(replicas) == active``).
        arrivals: requests that arrived in each past interval, oldest first, the interval
            ending at ``now`` last (as long a history as the caller keeps; may be empty).
        slo_attainment: share of the requests finished in the last interval that met their SLO,
            in [0, 1]; None if none finished.
        role: the role of the replicas this fleet scales: "mixed", or "prefill" / "decode"
            (a disaggregated cluster scales each pool with its own autoscaler; a decode
            pool's ``arrivals`` are the handoffs placed on it).

    Raises:
        ValueError: a field out of range (one line naming the field). Lists given for
            ``replicas`` or ``arrivals`` are stored as tuples.
    """

    now: float
    interval_s: float
    startup_delay_s: float
    min_replicas: int
    max_replicas: int
    active: int
    starting: int
    draining: int
    replicas: tuple[ReplicaView, ...]
    arrivals: tuple[float, ...] = ()
    slo_attainment: float | None = None
    role: str = "mixed"

    def __post_init__(self) -> None:
        _number("now", self.now, -math.inf)
        _number("interval_s", self.interval_s, 0.0, positive=True)
        _number("startup_delay_s", self.startup_delay_s, 0.0)
        for name in ("min_replicas", "active", "starting", "draining"):
            _count(name, getattr(self, name), 0)
        _count("max_replicas", self.max_replicas, max(1, self.min_replicas))
        if not isinstance(self.replicas, Sequence) or isinstance(self.replicas, str):
            raise ValueError(
                f"FleetView.replicas must be a sequence of views, got {self.replicas!r}"
            )
        object.__setattr__(self, "replicas", tuple(self.replicas))
        if len(self.replicas) != self.active:
            raise ValueError(
                f"FleetView.replicas must hold one view per active replica "
                f"({self.active}), got {len(self.replicas)}"
            )
        if not isinstance(self.arrivals, Sequence) or isinstance(self.arrivals, str):
            raise ValueError(
                f"FleetView.arrivals must be a sequence of counts, got {self.arrivals!r}"
            )
        for a in self.arrivals:
            _number("arrivals", a, 0.0)
        object.__setattr__(self, "arrivals", tuple(float(a) for a in self.arrivals))
        if self.role not in ("mixed", "prefill", "decode"):
            raise ValueError(f"FleetView.role must be mixed, prefill or decode, got {self.role!r}")
        s = self.slo_attainment
        if s is not None:
            _number("slo_attainment", s, 0.0)
            if s > 1:
                raise ValueError(f"FleetView.slo_attainment must be in [0, 1] or None, got {s!r}")

    @property
    def current(self) -> int:
        """Active plus starting replicas: the answer that keeps the fleet as it is."""
        return self.active + self.starting

    @property
    def last_rate(self) -> float | None:
        """Arrivals per second over the last interval (None without history)."""
        return self.arrivals[-1] / self.interval_s if self.arrivals else None

    def clamp(self, n: int) -> int:
        """``n`` within ``[min_replicas, max_replicas]``."""
        return max(self.min_replicas, min(self.max_replicas, n))


def check_now(owner: str, last: float | None, now: float) -> float:
    """``now``, after checking decisions come in time order.

    Raises:
        ValueError: ``now`` is earlier than the previous decision's ``last``.
    """
    if last is not None and now < last:
        raise ValueError(f"{owner}: view.now went backwards ({now!r} after {last!r})")
    return now


def ceil_count(x: float) -> int:
    """The replicas a fractional need ``x`` takes: ``ceil(x)``, except that a float a hair
    above a whole number (rounding error) counts as that number; never below 0."""
    return max(0, math.ceil(x - _CEIL_EPS))


class Autoscaler:
    """Base autoscaler: keeps the fleet as it is (subclasses override ``decide``).

    See the module docstring for the contract every subclass keeps.
    """

    name = "base"

    def decide(self, view: FleetView) -> int:
        """The desired number of replicas (active + starting) after this interval.

        The caller clamps it to ``[view.min_replicas, view.max_replicas]`` (built-in
        autoscalers already answer within them). Must not mutate ``view`` or what it refers to.
        """
        return view.clamp(view.current)

    def check_integrity(self) -> None:
        """Assert the autoscaler's own state is consistent (none by default)."""
