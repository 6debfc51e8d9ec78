"""The time-sliced shared GPU (``simulator.device_sharing``): a step never ends before its
isolated time, a replica alone is a replica on its own GPU, the bookings stay consistent, and
the same inputs give the same outputs."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
from sched_driver import random_requests

from horizon.cluster import make_router
from horizon.plan import StepPlan
from horizon.policies import make_policy
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.builder import fresh_copy
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.device_sharing import FIT_FILE, DeviceSpec, SliceFit, TimeSlices
from simulator.shared_device import SharedDevice

CFG = SchedulerConfig(
    num_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
)
MODES = [(False, False), (True, True), (True, False)]  # (pipelined, arrivals at boundaries)
# a mixed step of more than 100 tokens (decodes included) comes in 2 slices, of more than 200 in 3
FIT = SliceFit((0.0, 0.01, 0.0, 0.0, 0.0, 0.0))


@dataclass(frozen=True)
class TokenCost:
    """2 ms a step plus 10 us a token: steps differ, so slices and waits differ."""

    def step_time(self, plan: StepPlan) -> float:
        return 0.0 if plan.is_empty else 0.002 + 1e-5 * plan.num_tokens


def _plan(prefill: int = 0, decodes: int = 1) -> StepPlan:
    return StepPlan(0, 0.0, (None,) * decodes, (), num_prefill_tokens=prefill)  # type: ignore[arg-type]


def _setups(n: int, device) -> list[ReplicaSetup]:  # noqa: ANN001
    return [ReplicaSetup(CFG, make_policy("fcfs"), TokenCost(), device=device) for _ in range(n)]


def _run(reqs, setups, mode):  # noqa: ANN001, ANN202
    pipelined, hold = mode
    sim = ClusterSimulation(
        [fresh_copy(r) for r in reqs],
        setups,
        make_router("round_robin"),
        pipelined=pipelined,
        arrivals_at_step_boundaries=hold,
        check_every=1,  # every step: the replicas', the router's and the device's integrity
    )
    return sim, sim.run()


def test_book_adds_one_slice_of_each_busy_neighbour_per_slice():
    ts = TimeSlices(FIT)
    assert ts.book(0.0, 1.0, _plan(), 0.0, "a") == 1.0  # alone: its isolated time
    assert ts.book(0.5, 1.0, _plan(), 0.5, "b") == 2.5  # a's 1 s slice runs in between
    # c: 2 slices (150 tokens), a and b in flight (per slice 1.0 each): 2 * 2.0 waited
    assert ts.book(0.9, 2.0, _plan(prefill=150), 0.9, "c") == pytest.approx(6.9)
    # a again at 1.0: its own step is over, b's (1 s a slice) and c's (1 s a slice) in flight
    assert ts.book(1.0, 0.5, _plan(), 1.0, "a") == pytest.approx(3.5)
    assert ts.book(7.0, 0.5, _plan(), 7.0, "b") == 7.5  # everyone else done
    ts.check_integrity()
    assert ts.in_flight == 1


def test_slices_of_a_plan():
    assert FIT.slices(_plan(decodes=64)) == 1  # decode-only: one graph, one slice
    assert FIT.slices(_plan(prefill=50)) == 1
    assert FIT.slices(_plan(prefill=150)) == 2
    assert FIT.slices(_plan(prefill=301)) == 4
    shipped = SliceFit.from_file(FIT_FILE)
    assert shipped.slices(_plan(prefill=32, decodes=8)) == 1
    assert shipped.slices(_plan(prefill=1024, decodes=8)) == 2
    assert "cc9466b" in shipped.source


def test_specs_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="DeviceSpec.sharing"):
        DeviceSpec("gpu0", "mps")
    with pytest.raises(ValueError, match="DeviceSpec.fit"):
        DeviceSpec("gpu0", "fcfs", FIT)
    with pytest.raises(ValueError, match="DeviceSpec.name"):
        DeviceSpec("")
    with pytest.raises(ValueError, match="SliceFit.weights"):
        SliceFit((1.0, 2.0))


def test_reserve_never_ends_before_the_isolated_time():
    rng = random.Random(3)
    d = SharedDevice(DeviceSpec("g", "timeslice", FIT))
    now = 0.0
    for _ in range(2000):
        now += rng.expovariate(2000.0)
        start = now + rng.random() * 0.002  # pipelined: after the step in flight
        dur = rng.uniform(0.0005, 0.004)
        plan = _plan(prefill=rng.choice([0, 0, 0, 80, 250, 900]))
        end = d.reserve(start, dur, plan, now, rng.randrange(4))
        assert end >= start + dur
    d.check_integrity()
    assert d.waited_s > 0 and d.steps == 2000


@pytest.mark.parametrize("mode", MODES)
def test_alone_on_a_time_sliced_device_is_a_gpu_of_its_own(mode):
    reqs = random_requests(random.Random(8), 120, max_prompt=200, max_output=60, rate=40.0)
    _, sliced = _run(reqs, _setups(1, DeviceSpec("gpu0", "timeslice", FIT)), mode)
    _, own = _run(reqs, _setups(1, None), mode)
    assert sliced.replicas[0].digest() == own.replicas[0].digest()


@pytest.mark.parametrize("mode", MODES)
def test_co_located_steps_take_at_least_their_own_time(mode):
    reqs = random_requests(random.Random(9), 150, max_prompt=300, max_output=40, rate=150.0)
    sim, rec = _run(reqs, _setups(3, DeviceSpec("gpu0", "timeslice", FIT)), mode)
    _, apart = _run(reqs, _setups(3, None), mode)
    for r in rec.replicas:
        busy = (r.prefill_tokens + r.decode_tokens) > 0
        own = 0.002 + 1e-5 * (r.prefill_tokens + r.decode_tokens)
        assert np.all(r.step_durations()[busy] >= own[busy] - 1e-12)
    device = next(iter(sim.devices.values()))
    device.check_integrity()
    assert device.waited_s > 0  # they did share it
    mean = [np.mean(np.diff(r.step_end)) for r in rec.replicas]
    assert min(mean) > 1.3 * max(np.mean(np.diff(r.step_end)) for r in apart.replicas)


def test_same_inputs_give_identical_outputs():
    reqs = random_requests(random.Random(10), 150, max_prompt=300, max_output=40, rate=150.0)
    spec = DeviceSpec("gpu0", "timeslice", FIT)
    runs = [_run(reqs, _setups(3, spec), (True, False))[1] for _ in range(2)]
    assert [r.digest() for r in runs[0].replicas] == [r.digest() for r in runs[1].replicas]
