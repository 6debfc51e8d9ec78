"""Autoscalers decide from frozen fleet views: each built-in policy's rule on hand-built series
(when it moves, by how much, when it must not), the views' contract, the registry."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import pytest

from horizon.cluster.autoscaler import Autoscaler, FleetView, ceil_count
from horizon.cluster.autoscalers import AUTOSCALERS, autoscaler_names, make_autoscaler
from horizon.cluster.autoscalers.conservative import Conservative
from horizon.cluster.autoscalers.predictive import Predictive, holt_forecast
from horizon.cluster.autoscalers.reactive import Reactive

INTERVAL = 15.0


@dataclass(frozen=True)
class Rep:
    """A stand-in for a ReplicaView: the attributes an autoscaler reads."""

    num_waiting: int = 0
    num_running: int = 0
    kv_used_blocks: int = 0
    num_blocks: int = 100
    queued_prefill_tokens: int = 0
    step_time: float = 0.0


class HoldAt(Autoscaler):
    """A user's autoscaler, loaded by path in the registry test."""

    name = "hold_at"

    def __init__(self, n: int = 3) -> None:
        self.n = n

    def decide(self, view: FleetView) -> int:
        return self.n


def fleet(
    t: float,
    reps: list[Rep] | None = None,
    active: int = 4,
    starting: int = 0,
    arrivals: tuple[float, ...] = (),
    slo: float | None = None,
    delay: float = 0.0,
    lo: int = 1,
    hi: int = 64,
) -> FleetView:
    reps = [Rep()] * active if reps is None else reps
    return FleetView(t, INTERVAL, delay, lo, hi, len(reps), starting, 0, reps, arrivals, slo)


def loaded(t: float, per_replica: int, active: int = 4, **kw) -> FleetView:  # noqa: ANN003
    """``active`` replicas each running ``per_replica`` requests."""
    return fleet(t, [Rep(num_running=per_replica)] * active, **kw)


def run(scaler: Autoscaler, views: list[FleetView]) -> list[int]:
    out = [scaler.decide(v) for v in views]
    scaler.check_integrity()
    return out


def series(per_replica: list[int]) -> list[FleetView]:
    """Open loop: the same four replicas, one interval apart, at the given loads."""
    return [loaded(i * INTERVAL, q) for i, q in enumerate(per_replica)]


# --- the view ------------------------------------------------------------------------------


def test_fleet_view_is_frozen_and_names_the_bad_field():
    v = fleet(0.0, reps=[Rep()], arrivals=[1, 2])
    assert v.replicas == (Rep(),) and v.arrivals == (1.0, 2.0) and v.current == 1
    assert v.last_rate == pytest.approx(2 / INTERVAL) and v.clamp(100) == 64 and v.clamp(0) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.active = 3  # type: ignore[misc]
    ok = dict(now=0.0, interval_s=15.0, startup_delay_s=0.0, min_replicas=1, max_replicas=4,
              active=1, starting=0, draining=0, replicas=(Rep(),))  # fmt: skip
    bad = {
        "interval_s": 0.0,
        "startup_delay_s": -1.0,
        "min_replicas": -1,
        "max_replicas": 0,
        "starting": 1.5,
        "draining": True,
        "replicas": (Rep(), Rep()),
        "arrivals": (1.0, -2.0),
        "slo_attainment": 1.5,
        "now": float("nan"),
    }
    for field, value in bad.items():
        with pytest.raises(ValueError, match=f"FleetView.{field}"):
            FleetView(**{**ok, field: value})
    with pytest.raises(ValueError, match="FleetView.max_replicas"):
        FleetView(**{**ok, "min_replicas": 5})


def test_decide_never_mutates_the_view():
    reps = [Rep(num_waiting=9, num_running=40, kv_used_blocks=95)] * 4
    v = fleet(0.0, reps, starting=1, arrivals=(100.0, 400.0, 900.0), slo=0.5, delay=60.0)
    before = copy.deepcopy(v)
    scalers = [Autoscaler(), Predictive(per_replica_capacity=5.0)]
    scalers += [cls(signal=s) for cls in (Reactive, Conservative) for s in ("utilization", "kv")]
    scalers += [Reactive(signal="slo"), Conservative(signal="queue")]
    for s in scalers:
        s.decide(v)
        s.check_integrity()
        assert v == before and v.replicas == before.replicas
    for field in ("now", "active", "replicas", "arrivals", "slo_attainment"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(v, field, None)


def test_ceil_count_ignores_float_noise_but_not_real_fractions():
    assert ceil_count(0.1 * 3 / 0.3) == 1  # 1.0000000000000002
    assert ceil_count(1.001) == 2 and ceil_count(-0.5) == 0 and ceil_count(0.0) == 0


# --- reactive ------------------------------------------------------------------------------


def test_reactive_scales_up_after_up_intervals_above_and_not_before():
    r = Reactive(target_per_replica=10.0, up_intervals=3)
    # 15 per replica: utilisation 1.5 > up 1.1; HPA's size: ceil(4 * 1.5 / 1.0) = 6.
    assert run(r, series([15, 15, 15])) == [4, 4, 6]
    # A dip into the band breaks the streak: three more intervals above are needed.
    r = Reactive(target_per_replica=10.0, up_intervals=3)
    assert run(r, series([15, 15, 10, 15, 15, 15])) == [4, 4, 4, 4, 4, 6]
    # The move is capped at max(2 * current, current + 4): 200 per replica wants 80.
    assert run(Reactive(target_per_replica=10.0), series([200])) == [8]


def test_reactive_scales_down_only_after_the_window_to_its_highest_recommendation():
    r = Reactive(target_per_replica=10.0, down_intervals=5)
    # 7 per replica (0.7 < down 0.9) recommends ceil(2.8) = 3, then 5 per replica 2: the
    # window's highest, 3, is where it goes, and only at the fifth interval below.
    assert run(r, series([7, 5, 5, 5, 5])) == [4, 4, 4, 4, 3]
    # HPA's defaults: 20 intervals (300 s at 15 s) below before anything goes.
    out = run(Reactive(target_per_replica=10.0), series([5] * 20))
    assert out == [4] * 19 + [2]


def test_hysteresis_keeps_a_signal_oscillating_inside_the_band_from_flapping():
    r = Reactive(target_per_replica=100.0, up_intervals=1, down_intervals=1)
    inside = [92 if i % 2 else 108 for i in range(200)]  # 0.92 .. 1.08, inside [0.9, 1.1]
    assert set(run(r, series(inside))) == {4}
    # Crossing the edges alternately never builds a streak of two.
    r = Reactive(target_per_replica=100.0, up_intervals=2, down_intervals=2, sizing="step")
    across = [120 if i % 2 else 80 for i in range(200)]
    assert set(run(r, series(across))) == {4}
    # Without a band (edges at the target, one interval each) the same signal flaps.
    r = Reactive(target_per_replica=100.0, up=1.0, down=0.99, down_intervals=1, sizing="step")
    assert len(set(run(r, series(across)))) > 1


def test_reactive_counts_starting_replicas_idle_when_scaling_up():
    r = Reactive(target_per_replica=10.0)
    # 12 per active replica is 1.2, but over 4 active + 2 starting it is 0.8: no second move.
    assert r.decide(loaded(0.0, 12, starting=2)) == 6
    assert r.decide(loaded(15.0, 12, starting=0)) == 5  # 1.2 over 4: ceil(4.8)


def test_reactive_step_sizing_waits_out_the_cooldown():
    r = Reactive(target_per_replica=10.0, sizing="step", step=2, cooldown_s=60.0)
    n, moves = 4, []
    for i in range(12):  # closed loop: the fleet becomes what was asked, 100 requests in all
        total = 100
        reps = [Rep(num_running=total // n)] * n
        m = r.decide(fleet(i * INTERVAL, reps))
        if m != n:
            moves.append((i * INTERVAL, m))
        n = m
    assert moves == [(0.0, 6), (60.0, 8), (120.0, 10)]


def test_reactive_on_kv_queue_and_slo_signals():
    kv = [Rep(kv_used_blocks=90)] * 4  # 0.9 > 0.88: ceil(4 * 0.9 / 0.8) = 5
    assert Reactive(signal="kv").decide(fleet(0.0, kv)) == 5
    q = [Rep(num_waiting=8)] * 4  # 8 > 5.5 waiting: ceil(32 / 5) = 7
    assert Reactive(signal="queue").decide(fleet(0.0, q)) == 7
    r = Reactive(signal="slo", up_intervals=2, down_intervals=2)
    busy = [Rep(num_running=3)] * 4
    # 20% missed twice: one step up; nothing finished while busy: no reading, hold.
    views = [fleet(0.0, busy, slo=0.8), fleet(15.0, busy, slo=0.8)]
    views += [fleet(30.0, busy, slo=0.8), fleet(45.0, busy), fleet(60.0, busy, slo=0.8)]
    assert run(r, views) == [4, 5, 4, 4, 4]
    # An idle fleet with nothing finished reads 0 missed: it scales down.
    r = Reactive(signal="slo", down_intervals=2)
    assert run(r, [fleet(0.0), fleet(15.0)]) == [4, 3]


def test_reactive_scales_from_zero_on_demand():
    r = Reactive()
    assert r.decide(fleet(0.0, [], lo=0, arrivals=(0.0, 0.0))) == 0
    assert r.decide(fleet(15.0, [], lo=0, arrivals=(0.0, 3.0))) == 1
    assert r.decide(fleet(30.0, [], starting=1, lo=0, arrivals=(3.0, 3.0))) == 1  # no reading


# --- predictive ----------------------------------------------------------------------------


def test_holt_forecast_extrapolates_a_line_and_holds_a_constant():
    line = [100.0 * (i + 1) for i in range(10)]
    assert holt_forecast(line, 0.5, 0.3, 1) == pytest.approx(1100.0)
    assert holt_forecast(line, 0.5, 0.3, 7) == pytest.approx(1700.0)
    assert holt_forecast([5.0] * 6, 0.3, 0.1, 4) == pytest.approx(5.0)
    assert holt_forecast([5.0], 0.3, 0.1, 4) == 5.0


def test_predictive_provisions_ahead_of_a_rising_load_and_further_with_a_longer_startup():
    arrivals = tuple(150.0 * (i + 1) for i in range(10))  # 10, 20, ... 100 req/s per 15 s
    now_rate = arrivals[-1] / INTERVAL
    needed_now = ceil_count(now_rate / 10.0)  # 10 replicas at 10 req/s each
    ahead = {}
    for delay in (0.0, 60.0):
        p = Predictive(per_replica_capacity=10.0, headroom=0.0)
        v = fleet(0.0, [Rep()] * needed_now, arrivals=arrivals, delay=delay)
        ahead[delay] = (p.forecast_rate(v), p.decide(v))
    # one interval ahead: 110 req/s -> 11; five intervals ahead (60 s + one): 150 -> 15
    assert ahead[0.0] == (pytest.approx(110.0), 11)
    assert ahead[60.0] == (pytest.approx(150.0), 15)
    assert needed_now < ahead[0.0][1] < ahead[60.0][1]
    p = Predictive(per_replica_capacity=10.0)  # 10% headroom: ceil(11 * 1.1) = 13
    assert p.decide(fleet(0.0, [Rep()] * 10, arrivals=arrivals)) == 13


def test_predictive_scales_up_at_once_and_down_only_after_the_stabilization_window():
    # alpha 1, beta 0, a flat start: the forecast is the last count (no smoothing lag)
    p = Predictive(per_replica_capacity=2.0, alpha=1.0, beta=0.0, headroom=0.0, stabilization_s=60)
    n, hist, out = 10, [300.0, 300.0], []
    for i in range(12):
        hist.append(300.0 if i < 4 else 150.0)  # 20 req/s, then 10 from t = 60
        n = p.decide(fleet(i * INTERVAL, [Rep()] * n, arrivals=tuple(hist)))
        out.append(n)
    # the last 10 was recommended at t = 45; it leaves the 60 s window after t = 105
    assert out == [10] * 8 + [5] * 4
    p.check_integrity()
    assert p.decide(fleet(180.0, [Rep()] * 5, arrivals=(600.0, 600.0))) == 20  # up at once
    # a fresh autoscaler does not shrink the fleet it found before a whole window
    p = Predictive(per_replica_capacity=2.0, alpha=1.0, beta=0.0, stabilization_s=30.0)
    out = [p.decide(fleet(i * INTERVAL, arrivals=(30.0, 30.0))) for i in range(4)]
    assert out == [4, 4, 4, 2]


# --- conservative --------------------------------------------------------------------------


SERIES = {
    # per-replica load (target 10 a replica) rising past the target, then falling away
    "utilization": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] + [10, 8, 6, 3] + [1] * 60,
    "kv": [30, 40, 50, 60, 70, 80, 90, 95] + [70, 50, 20] + [5] * 60,
    "queue": [0, 1, 2, 3, 4, 5, 6, 7, 8] + [4, 2, 1] + [0] * 60,
    "slo": [100, 99, 97, 95, 90, 85, 80] + [95, 99, 100] + [100] * 60,  # attainment, %
}


def _views(signal: str) -> list[FleetView]:
    out = []
    for i, x in enumerate(SERIES[signal]):
        if signal == "utilization":
            reps, slo = [Rep(num_running=x)] * 4, None
        elif signal == "kv":
            reps, slo = [Rep(kv_used_blocks=x)] * 4, None
        elif signal == "queue":
            reps, slo = [Rep(num_waiting=x)] * 4, None
        else:
            reps, slo = [Rep(num_running=1)] * 4, x / 100
        out.append(fleet(i * INTERVAL, reps, slo=slo))
    return out


def _first(decisions: list[int], moved) -> int:  # noqa: ANN001
    return next(i for i, d in enumerate(decisions) if moved(d))


@pytest.mark.parametrize("signal", ["utilization", "kv", "queue", "slo"])
def test_conservative_scales_up_no_later_and_down_no_earlier_than_reactive(signal):
    views = _views(signal)
    react = run(Reactive(signal=signal, target_per_replica=10.0), views)
    cons = run(Conservative(signal=signal, target_per_replica=10.0), views)
    assert _first(cons, lambda d: d > 4) <= _first(react, lambda d: d > 4)
    peak = len(SERIES[signal]) - 60
    assert _first(cons[peak:], lambda d: d < 4) >= _first(react[peak:], lambda d: d < 4)
    if signal == "utilization":  # and really earlier, by more, and later on this ramp
        assert _first(cons, lambda d: d > 4) < _first(react, lambda d: d > 4)
        assert max(cons) > max(react)
        assert _first(cons[peak:], lambda d: d < 4) > _first(react[peak:], lambda d: d < 4)


def test_conservative_defaults_are_early_up_late_down():
    for signal in ("utilization", "kv", "queue", "slo"):
        c, r = Conservative(signal=signal).config, Reactive(signal=signal).config
        assert c.up <= r.up and c.down <= r.down and c.up_intervals <= r.up_intervals
        assert c.down_intervals >= r.down_intervals and c.target <= r.target


# --- registry and knobs --------------------------------------------------------------------


def test_registry_by_name_and_by_path():
    assert autoscaler_names() == ["conservative", "predictive", "reactive"]
    assert type(make_autoscaler("reactive")) is Reactive
    assert type(make_autoscaler("conservative", signal="kv")) is Conservative
    assert make_autoscaler("predictive", per_replica_capacity=3.0).config.per_replica_capacity == 3
    own = make_autoscaler("tests.test_autoscalers:HoldAt", n=5)
    assert type(own).__name__ == "HoldAt" and own.decide(fleet(0.0)) == 5
    with pytest.raises(ValueError, match="unknown autoscaler 'hpa'; known: conservative"):
        make_autoscaler("hpa")
    with pytest.raises(ValueError, match="cannot import"):
        AUTOSCALERS.make("tests.no_such_module:X")


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("reactive", {"signal": "cpu"}, "reactive.signal"),
        ("reactive", {"up": 0.5, "down": 0.9}, "reactive.up"),
        ("reactive", {"target": 0.0}, "reactive.target"),
        ("reactive", {"target": 2.0, "up": 1.5, "down": 1.0}, "reactive.target"),
        ("reactive", {"up_intervals": 0}, "reactive.up_intervals"),
        ("reactive", {"cooldown_s": -1.0}, "reactive.cooldown_s"),
        ("reactive", {"signal": "slo", "sizing": "proportional"}, "reactive.sizing"),
        ("reactive", {"max_up_ratio": 0.5}, "reactive.max_up_ratio"),
        ("conservative", {"step": 0}, "conservative.step"),
        ("conservative", {"down_intervals": 1.5}, "conservative.down_intervals"),
        ("predictive", {"per_replica_capacity": 0.0}, "predictive.per_replica_capacity"),
        ("predictive", {"per_replica_capacity": 1.0, "alpha": 0.0}, "predictive.alpha"),
        ("predictive", {"per_replica_capacity": 1.0, "beta": 1.5}, "predictive.beta"),
        ("predictive", {"per_replica_capacity": 1.0, "headroom": -0.1}, "predictive.headroom"),
        ("predictive", {}, "per_replica_capacity"),
        ("reactive", {"upp": 1.0}, "bad options for autoscaler 'reactive'"),
    ],
)
def test_bad_options_name_the_option(name, options, field):
    with pytest.raises(ValueError, match=field):
        make_autoscaler(name, **options)


def test_decisions_in_time_order_only():
    r = Reactive()
    r.decide(fleet(30.0))
    with pytest.raises(ValueError, match="went backwards"):
        r.decide(fleet(15.0))
