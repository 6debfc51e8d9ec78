"""Autoscaling a disaggregated cluster: its prefill and decode replicas scale as two pools, each
with its own autoscaler and settings. No request is lost, a standby decode replica takes no
handoff before a decision plus its start-up delay, each pool's view holds its own replicas
and role, a decode pool counts the handoffs placed on it, and GPU-seconds add up over pools."""

from __future__ import annotations

import numpy as np
import pytest
from sched_driver import ConstantCost
from test_autoscaling_sim import CFG, _requests

from horizon.cluster import Autoscaler, FleetView, make_autoscaler, make_router
from horizon.metrics.records import STATUS_FINISHED
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.workload.builder import fresh_copy
from simulator.autoscaling import AutoscaleConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.kv_link import LINKS

SHAPE = model_shape("qwen2.5-0.5b")


class Seen(Autoscaler):
    """An autoscaler's decisions, with every view it got kept."""

    name = "seen"

    def __init__(self, name: str, **options) -> None:
        self.inner, self.views = make_autoscaler(name, **options), []

    def decide(self, view: FleetView) -> int:
        self.views.append(view)
        return self.inner.decide(view)


def _run(reqs, autoscaler, cfg, n: int = 3):  # noqa: ANN001, ANN202
    setups = [
        ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(0.02), SHAPE, role=role)
        for role in ("prefill", "decode")
        for _ in range(n)
    ]
    sim = ClusterSimulation(
        [fresh_copy(r) for r in reqs], setups, make_router("least_loaded"),
        decode_router=make_router("least_kv"), kv_link=LINKS["nvlink"],
        autoscaler=autoscaler, autoscale=cfg, check_every=1,
    )  # fmt: skip
    return sim, sim.run()


def test_prefill_and_decode_pools_scale_apart_and_lose_nothing():
    reqs = _requests(2)
    # a prefill replica clears its queue within a step: its pool scales on the arrival rate
    scalers = {"prefill": Seen("predictive", per_replica_capacity=8.0), "decode": Seen("reactive")}
    delay = {"prefill": 12.0, "decode": 7.0}
    cfg = {r: AutoscaleConfig(interval_s=5, startup_delay_s=d, initial=1) for r, d in delay.items()}
    sim, rec = _run(reqs, scalers, cfg)
    rec.check()
    merged = rec.merged()
    assert np.all(merged.status[merged.num_prompt_tokens >= 2] == STATUS_FINISHED)
    pools = rec.fleet["pools"]
    for role in ("prefill", "decode"):
        assert max(row[1] for row in pools[role]["timeline"]) > 1  # each pool scaled up
        views = scalers[role].views
        assert views and all(v.role == role for v in views)
        assert all(len(v.replicas) == v.active <= 3 for v in views)
    pool_of = {v.index: "prefill" if v.index < 3 else "decode" for v in sim.cluster.views}
    assert all(pool_of[x.index] == "prefill" for v in scalers["prefill"].views for x in v.replicas)
    t = rec.transfers
    for j in (4, 5):  # standby decode replicas at 0: no handoff before a decision plus the delay
        mine = t["dst"] == j
        if mine.any():
            assert t["start"][mine].min() >= 5.0 + delay["decode"] - 1e-9
    handoffs = sum(v.arrivals[-1] for v in scalers["decode"].views)
    assert 0 < handoffs <= len(t["request_id"])  # the decode pool counts the handoffs it took
    gpu = rec.fleet["gpu_seconds"]
    assert gpu == pytest.approx(sum(p["gpu_seconds"] for p in pools.values()))
    span = max(float(r.step_end[-1]) for r in rec.replicas if len(r.step_end))
    assert gpu < len(rec.replicas) * span
    sim.autoscale.check_integrity()


def test_one_autoscaler_for_a_cluster_with_roles_names_the_field():
    with pytest.raises(ValueError, match="autoscaler: one per role"):
        _run(_requests(3, spans=(5, 5, 5)), make_autoscaler("reactive"), AutoscaleConfig())
    one = make_autoscaler("reactive")
    with pytest.raises(ValueError, match="its own object"):
        _run(_requests(3, spans=(5, 5, 5)), {"prefill": one, "decode": one}, None)
