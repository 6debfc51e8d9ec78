"""The round-robin time-sliced GPU (``simulator.quantum_device``, ``DeviceSpec(sharing=
"quantum")``): turns of at most one quantum, a context giving up its turn at a step's end,
steps stretched by neighbours that submit after them, a replica alone as on its own GPU, and
the cluster simulator's late step ends (records, closed-loop sessions) on it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import simpy
from sched_driver import random_requests
from test_cluster_simulation import _sessions, assert_turns_follow_replies
from test_device_sharing import TokenCost

from horizon.cluster import make_router
from horizon.metrics.records import STATUS_FINISHED
from horizon.policies import make_policy
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.builder import fresh_copy
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.device_sharing import DeviceSpec
from simulator.quantum_device import QuantumDevice
from simulator.shared_device import SharedDevice

CFG = SchedulerConfig(
    num_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192
)
MS = 1e-3


def _ends(device_args: dict, owners: dict, starts: dict | None = None) -> dict:
    """Each owner submits its steps (ms) back to back from its start (ms): their end times."""
    env = simpy.Environment()
    dev = QuantumDevice(env, **device_args)
    ends: dict = {}

    def owner(name, steps, start):  # noqa: ANN001, ANN202
        yield env.timeout(start * MS)
        for d in steps:
            t = yield dev.submit(name, d * MS)
            ends.setdefault(name, []).append(round(t / MS, 6))
            dev.check_integrity()

    for name, steps in owners.items():
        env.process(owner(name, steps, (starts or {}).get(name, 0.0)))
    env.run()
    assert dev.busy_s == pytest.approx(MS * sum(sum(s) for s in owners.values()))
    return ends


def test_alone_a_step_takes_its_own_time():
    assert _ends({"quantum_s": 2 * MS}, {"a": [1.0, 5.0, 0.5]}) == {"a": [1.0, 6.0, 6.5]}


def test_turns_alternate_at_step_ends_and_long_steps_are_sliced():
    ends = _ends({"quantum_s": 2 * MS}, {"a": [1.0] * 4, "b": [1.0, 5.0, 1.0]})
    # a 0-1, b 1-2, a 2-3, b 3-5 (slice), a 5-6, b 6-8 (slice), a 8-9, b 9-10 (done), b 10-11
    assert ends == {"a": [1.0, 3.0, 6.0, 9.0], "b": [2.0, 10.0, 11.0]}


def test_a_neighbour_that_comes_later_stretches_a_step_in_flight():
    alone = _ends({"quantum_s": 1 * MS}, {"a": [4.0]})
    shared = _ends({"quantum_s": 1 * MS}, {"a": [4.0], "b": [0.5, 0.5]}, {"b": 0.2})
    assert alone["a"] == [4.0]
    # a's first turn 0-1, b 1-1.5, a 1.5-2.5, b 2.5-3, a's last two turns back to back
    assert shared == {"a": [5.0], "b": [1.5, 3.0]}


def test_a_switch_between_contexts_costs_device_time():
    ends = _ends({"quantum_s": 2 * MS, "switch_s": 0.1 * MS}, {"a": [1.0, 1.0], "b": [1.0]})
    assert ends == {"a": [1.0, 3.2], "b": [2.1]}


def test_bad_settings_are_named():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="quantum_s"):
        QuantumDevice(env, 0.0)
    with pytest.raises(ValueError, match="switch_s"):
        QuantumDevice(env, 1e-3, -1.0)
    with pytest.raises(ValueError, match="DeviceSpec.quantum_s"):
        DeviceSpec("gpu0", "quantum")
    with pytest.raises(ValueError, match="DeviceSpec.quantum_s"):
        DeviceSpec("gpu0", "fcfs", quantum_s=1e-3)
    with pytest.raises(ValueError, match="DeviceSpec.switch_s"):
        DeviceSpec("gpu0", "timeslice", switch_s=1e-4)
    with pytest.raises(ValueError, match="needs the env"):
        SharedDevice(DeviceSpec("gpu0", "quantum", quantum_s=1e-3))


SPEC = DeviceSpec("gpu0", "quantum", quantum_s=2 * MS)


def _setups(n: int, device) -> list[ReplicaSetup]:  # noqa: ANN001
    return [ReplicaSetup(CFG, make_policy("fcfs"), TokenCost(), device=device) for _ in range(n)]


def _run(reqs, setups, hold: bool = True, sessions=()):  # noqa: ANN001, ANN202
    sim = ClusterSimulation(
        [fresh_copy(r) for r in reqs],
        setups,
        make_router("round_robin"),
        sessions=sessions,
        pipelined=True,
        arrivals_at_step_boundaries=hold,
        check_every=1,  # every step: the replicas', the router's and the device's integrity
    )
    return sim, sim.run()


@pytest.mark.parametrize("hold", [True, False])
def test_alone_on_a_quantum_device_is_a_gpu_of_its_own(hold):
    reqs = random_requests(random.Random(8), 120, max_prompt=200, max_output=60, rate=40.0)
    _, named = _run(reqs, _setups(1, SPEC), hold)
    _, own = _run(reqs, _setups(1, None), hold)
    a, b = named.replicas[0], own.replicas[0]
    for f in ("num_running", "prefill_tokens", "decode_tokens", "num_output_tokens"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f  # the same plans
    for f in ("step_start", "step_end", "token_times", "first_admit_time"):
        # the same times, but for rounding: a step longer than a quantum ends after its slices
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=0, atol=1e-12)


def test_sharing_slows_every_replica_never_below_its_own_time_and_repeats_exactly():
    reqs = random_requests(random.Random(9), 200, max_prompt=150, max_output=40, rate=150.0)
    _, apart = _run(reqs, _setups(3, None))
    sim, shared = _run(reqs, _setups(3, SPEC))
    _, again = _run(reqs, _setups(3, SPEC))
    assert shared.digest() == again.digest()
    shared.check()
    assert np.all(shared.merged().status == STATUS_FINISHED)
    for a, s in zip(apart.replicas, shared.replicas):
        assert np.mean(s.step_durations()) > 1.5 * np.mean(a.step_durations())
    device = sim.devices[SPEC]
    assert device.turns is not None and device.turns.queued == 0
    assert device.turns.busy_s == pytest.approx(device.busy_s)  # every step served whole
    end = max(float(r.step_end[-1]) for r in shared.replicas)
    assert device.turns.busy_s <= end + 1e-9
    for r in shared.replicas:  # each step took at least its own time (2 ms + 10 us a token)
        d = r.step_durations()
        own = 0.002 + 1e-5 * (r.prefill_tokens + r.decode_tokens)
        assert np.all(d[own > 0.002] >= own[own > 0.002] - 1e-9)


def test_closed_loop_sessions_follow_the_late_ends():
    sessions = _sessions(4, 3, think=0.2)
    _, rec = _run([], _setups(2, SPEC), sessions=sessions)
    assert_turns_follow_replies(rec, sessions, 0.2)


def test_the_quantum_rule_needs_the_pipelined_loop():
    with pytest.raises(ValueError, match="pipelined"):
        ClusterSimulation([], _setups(2, SPEC), make_router("round_robin"), pipelined=False)


def test_views_may_read_the_latest_step_end_reports_as_the_engine_s_driver_does():
    from horizon.cluster.stale_view import StaleView
    from horizon.cluster.view import LiveView

    reqs = random_requests(random.Random(4), 120, max_prompt=100, max_output=30, rate=150.0)
    sims = {}
    for live in (None, False):
        sims[live] = ClusterSimulation(
            [fresh_copy(r) for r in reqs],
            [ReplicaSetup(CFG, make_policy("fcfs"), TokenCost(), device=SPEC) for _ in range(3)],
            make_router("least_loaded"),
            pipelined=True,
            arrivals_at_step_boundaries=True,
            live=live,
        )
    assert all(isinstance(v, LiveView) for v in sims[None].cluster.views)
    assert all(isinstance(v, StaleView) for v in sims[False].cluster.views)
    live, reported = sims[None].run(), sims[False].run()
    for rec in (live, reported):
        rec.check()
        assert np.all(rec.merged().status == STATUS_FINISHED)
    assert live.assignment.tolist() != reported.assignment.tolist()  # routed on older loads


def _random_ends(seed: int, rounds: bool) -> tuple[dict, float, float]:
    """Owners that submit random steps at random times, up to two outstanding each (as a
    pipelined replica does): each owner's step ends, and the device's busy and switch time."""
    rng = random.Random(seed)
    env = simpy.Environment()
    dev = QuantumDevice(env, rng.choice([0.1, 0.25, 1.0]) * MS, rng.choice([0, 0.02]) * MS, rounds)
    ends: dict = {}

    def owner(name, steps):  # noqa: ANN001, ANN202
        pending = []
        for d, gap, depth in steps:
            yield env.timeout(gap * MS)
            pending.append(dev.submit(name, d * MS))
            while len(pending) > depth:
                ends.setdefault(name, []).append((yield pending.pop(0)) / MS)
                dev.check_integrity()
        for e in pending:
            ends.setdefault(name, []).append((yield e) / MS)

    for name in range(rng.randint(1, 5)):
        steps = [(rng.uniform(0.01, 4.0), rng.expovariate(1.0), rng.randint(0, 1))
                 for _ in range(rng.randint(1, 40))]  # fmt: skip
        env.process(owner(name, steps))
    env.run()
    return ends, dev.busy_s, dev.switch_total_s


@pytest.mark.parametrize("seed", range(40))
def test_whole_rounds_at_once_end_steps_as_slice_by_slice_does(seed):
    fast, busy, switched = _random_ends(seed, rounds=True)
    slow, busy0, switched0 = _random_ends(seed, rounds=False)
    assert fast.keys() == slow.keys()
    for name in slow:
        np.testing.assert_allclose(fast[name], slow[name], rtol=0, atol=1e-9)
    assert busy == pytest.approx(busy0, abs=1e-12) and switched == pytest.approx(switched0)
