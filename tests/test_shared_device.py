"""Co-located replicas on one simulated GPU: their steps never overlap on it and each is slowed,
and a replica alone on a named device is a replica on its own GPU."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sched_driver import ConstantCost, random_requests

from horizon.cluster import make_router
from horizon.policies import make_policy
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.builder import fresh_copy
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.shared_device import SharedDevice

CFG = SchedulerConfig(
    num_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
)
MODES = [(False, False), (True, True), (True, False)]  # (pipelined, arrivals at boundaries)


def _setups(n: int, device: str | None, cost: float = 0.01) -> list[ReplicaSetup]:
    return [
        ReplicaSetup(CFG, make_policy("fcfs"), ConstantCost(cost), device=device) for _ in range(n)
    ]


def _run(reqs, setups, mode):  # noqa: ANN001, ANN202
    pipelined, hold = mode
    sim = ClusterSimulation(
        [fresh_copy(r) for r in reqs],
        setups,
        make_router("round_robin"),
        pipelined=pipelined,
        arrivals_at_step_boundaries=hold,
        check_every=1,
    )
    return sim, sim.run()


def test_reserve_books_steps_first_come_first_served():
    d = SharedDevice("g")
    assert d.reserve(0.0, 1.0) == 1.0
    assert d.reserve(0.0, 1.0) == 2.0  # waits for the first
    assert d.reserve(5.0, 1.0) == 6.0  # the device is idle by then
    assert d.reserve(5.5, 0.0) == 5.5  # an empty step books nothing
    assert (d.busy_s, d.waited_s, d.steps) == (3.0, 1.0, 3)
    d.check_integrity()


@pytest.mark.parametrize("mode", MODES)
def test_co_located_steps_never_overlap_on_the_device(mode):
    reqs = random_requests(random.Random(7), 150, max_prompt=120, max_output=40, rate=120.0)
    sim, rec = _run(reqs, _setups(3, "gpu0"), mode)
    ends = np.sort(np.concatenate([r.step_end[r.step_durations() > 0] for r in rec.replicas]))
    assert len(ends) > 100
    assert np.all(np.diff(ends) >= 0.01 - 1e-9)  # each step holds the GPU its 10 ms
    device = sim.devices["gpu0"]
    assert device.waited_s > 0
    assert device.busy_s == pytest.approx(0.01 * device.steps)
    assert max(float(r.step_end[-1]) for r in rec.replicas) >= device.busy_s


@pytest.mark.parametrize("mode", MODES)
def test_alone_on_a_named_device_is_a_gpu_of_its_own(mode):
    reqs = random_requests(random.Random(8), 120, max_prompt=200, max_output=60, rate=40.0)
    _, named = _run(reqs, _setups(1, "gpu0"), mode)
    _, own = _run(reqs, _setups(1, None), mode)
    assert named.replicas[0].digest() == own.replicas[0].digest()


@pytest.mark.parametrize("mode", MODES)
def test_sharing_the_gpu_slows_every_replica(mode):
    reqs = random_requests(random.Random(9), 150, max_prompt=120, max_output=40, rate=120.0)
    _, apart = _run(reqs, _setups(2, None), mode)
    _, shared = _run(reqs, _setups(2, "gpu0"), mode)
    for a, s in zip(apart.replicas, shared.replicas):
        assert np.mean(np.diff(s.step_end)) > 1.3 * np.mean(np.diff(a.step_end))


def test_replicas_naming_one_device_share_it():
    setups = _setups(2, "gpu0") + _setups(1, "gpu1")
    sim = ClusterSimulation([], setups, make_router("round_robin"))
    assert sorted(sim.devices) == ["gpu0", "gpu1"]
    assert sim.backends[0].device is sim.backends[1].device
    assert sim.backends[2].device is not sim.backends[0].device
