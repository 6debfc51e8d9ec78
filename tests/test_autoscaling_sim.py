"""Autoscaling on the cluster simulator: a fleet held at its size is no autoscaling at all; a
started replica takes no request before its start-up delay is over; draining loses no request;
GPU-seconds count provisioned time; views stay read-only."""

from __future__ import annotations

import numpy as np
import pytest
from sched_driver import ConstantCost

from horizon.cluster import Autoscaler, FleetView, make_autoscaler, make_router
from horizon.metrics.latency import max_itl, ttft
from horizon.metrics.records import STATUS_FINISHED
from horizon.policies import make_policy
from horizon.request import SLO, Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import patterns
from horizon.workload.builder import fresh_copy
from simulator.autoscaling import AutoscaleConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup

CFG = SchedulerConfig(
    num_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
)


def _requests(seed: int, rates=(5, 40, 5), spans=(40, 40, 40)) -> list[Request]:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    times = patterns.arrivals(patterns.step(list(rates), list(spans)), float(sum(spans)), rng)
    lens = rng.integers(20, 200, len(times)), rng.integers(5, 64, len(times))
    return [
        Request(i, float(t), int(p), 64, int(g)) for i, (t, p, g) in enumerate(zip(times, *lens))
    ]


def _run(reqs, autoscaler, cfg: AutoscaleConfig, n: int = 6):  # noqa: ANN001, ANN202
    setups = [ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(0.02)) for _ in range(n)]
    sim = ClusterSimulation(
        [fresh_copy(r) for r in reqs], setups, make_router("least_loaded"),
        autoscaler=autoscaler, autoscale=cfg, check_every=1,
    )  # fmt: skip
    return sim, sim.run()


class Hold(Autoscaler):
    name = "hold"

    def __init__(self, n: int) -> None:
        self.n = n

    def decide(self, view: FleetView) -> int:
        return self.n


def test_a_fleet_held_at_its_size_is_the_cluster_without_an_autoscaler():
    reqs = _requests(1)
    _, held = _run(reqs, Hold(4), AutoscaleConfig(interval_s=5, initial=4), n=4)
    setups = [ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(0.02)) for _ in range(4)]
    plain = ClusterSimulation([fresh_copy(r) for r in reqs], setups, make_router("least_loaded"))
    assert [r.digest() for r in held.replicas] == [r.digest() for r in plain.run().replicas]
    span = max(float(r.step_end[-1]) for r in held.replicas)
    assert held.fleet["gpu_seconds"] == pytest.approx(4 * span)


SCALERS = [("reactive", {}), ("conservative", {}), ("predictive", {"per_replica_capacity": 8.0})]


@pytest.mark.parametrize("name,options", SCALERS)
def test_scaling_up_and_down_loses_no_request_and_respects_the_start_up_delay(name, options):
    reqs = _requests(2)
    delay = 12.0
    cfg = AutoscaleConfig(interval_s=5, startup_delay_s=delay, initial=1)
    sim, rec = _run(reqs, make_autoscaler(name, **options), cfg)
    rec.check()
    merged = rec.merged()
    assert np.all(merged.status == STATUS_FINISHED)  # draining finished what it held
    timeline = rec.fleet["timeline"]
    assert max(row[1] for row in timeline) > 1  # it scaled up for the burst
    for i in range(1, len(rec.replicas)):
        mine = rec.assignment == i
        if mine.any():  # standby at 0: routable only after a decision plus the delay
            assert merged.arrival_time[mine].min() >= cfg.interval_s + delay - 1e-9
    span = max(float(r.step_end[-1]) for r in rec.replicas if len(r.step_end))
    assert rec.fleet["gpu_seconds"] < len(rec.replicas) * span  # not all provisioned all along
    sim.autoscale.check_integrity()


def test_the_view_an_autoscaler_gets_is_read_only():
    seen = []

    class Poke(Autoscaler):
        name = "poke"

        def decide(self, view: FleetView) -> int:
            with pytest.raises(AttributeError):
                view.replicas[0].num_running = 0  # type: ignore[misc]
            with pytest.raises(AttributeError):
                view.active = 9  # type: ignore[misc]
            seen.append(view.active)
            return 2

    _run(_requests(3, spans=(10, 10, 10)), Poke(), AutoscaleConfig(interval_s=5, initial=1))
    assert seen and seen[0] == 1


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="AutoscaleConfig.interval_s"):
        AutoscaleConfig(interval_s=0)
    with pytest.raises(ValueError, match="Fleet.initial"):
        _run([], Hold(1), AutoscaleConfig(initial=9), n=2)
    with pytest.raises(ValueError, match="Fleet.min_replicas"):
        _run([], Hold(1), AutoscaleConfig(min_replicas=0, initial=1), n=2)


def test_slo_attainment_is_what_the_records_say_and_drives_the_slo_signal():
    """With ``AutoscaleConfig.slo`` the views carry the share of the interval's finished
    requests that met it: per request the same verdict as the records' TTFT and largest gap;
    the reactive ``slo`` signal then scales up for the burst."""
    slo = SLO(ttft=0.5, itl=0.05)
    seen: list[float | None] = []

    class Watch(Autoscaler):
        name = "watch"

        def __init__(self) -> None:
            self.inner = make_autoscaler("reactive", signal="slo")

        def decide(self, view: FleetView) -> int:
            seen.append(view.slo_attainment)
            return self.inner.decide(view)

    cfg = AutoscaleConfig(interval_s=5, startup_delay_s=5, initial=1, slo=slo)
    sim, rec = _run(_requests(4), Watch(), cfg)
    rec.check()
    shares = [s for s in seen if s is not None]
    assert min(shares) < 0.9 and max(shares) == 1.0
    assert max(row[1] for row in rec.fleet["timeline"]) > 1
    verdicts = set()
    for replica, records in zip(sim.cluster.replicas, rec.replicas):
        recorder = replica.scheduler.recorder
        ok = (ttft(records) <= slo.ttft) & (np.nan_to_num(max_itl(records)) <= slo.itl)
        done = np.flatnonzero(records.status == STATUS_FINISHED)
        reqs = {r.request_id: r for r in [*sim.open_loop]}
        for i in done:
            req = reqs[int(records.request_id[i])]
            assert recorder.slo_met(req, slo.ttft, slo.itl) == bool(ok[i])
            verdicts.add(bool(ok[i]))
    assert verdicts == {True, False}
