"""The one serving loop (horizon/serving_loop.py) with a toy backend on a fake wall clock:
what both real backends rely on, checked without either."""

from __future__ import annotations

import math

import numpy as np
import pytest

from horizon.plan import StepPlan, StepResult
from horizon.policies import Policy, make_policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.serving_loop import InFlight, serve
from horizon.trace_stop import TraceStop
from horizon.wall_clock import ListArrivals, run_wall_clock

STEP = 0.01  # every non-empty step takes 10 ms of (fake) real time


class FakeClock:
    """A wall clock that moves only when the toy backend works or the driver sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> float:
        return self.t + seconds

    def until(self, t: float) -> float:
        return t

    def do_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


class ToyBackend:
    """Real work, in fake time: ``execute`` takes STEP; pipelined, a step's tokens are read
    STEP after it was submitted (its end is known only then)."""

    advances_clock = False

    def __init__(self, clock: FakeClock, pipelined: bool) -> None:
        self.clock, self.pipelined = clock, pipelined
        self.stop = TraceStop()
        self.checked = 0

    def host_delay(self, step: int, now: float, woke: bool) -> float:
        return 0.0

    def execute(self, plan: StepPlan) -> StepResult:
        if not plan.is_empty:
            self.clock.t += STEP
        return StepResult(STEP, tuple(self.stop.finished(plan)))

    def drains_before(self, plan: StepPlan) -> bool:
        return plan.is_empty

    def submit(self, plan: StepPlan) -> InFlight:
        done_at = self.clock.t + (0.0 if plan.is_empty else STEP)
        return InFlight(plan, StepResult(math.nan, tuple(self.stop.finished(plan))), token=done_at)

    def wait(self, step: InFlight) -> None:
        self.clock.t = max(self.clock.t, step.token)  # blocks until the step is done
        step.end = self.clock.t

    def check_integrity(self) -> None:
        self.checked += 1


def run(requests, pipelined: bool, policy: Policy | None = None, end: float = math.inf):  # noqa: ANN001
    clock = FakeClock()
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=4), policy or make_policy("fcfs"))
    backend = ToyBackend(clock, pipelined)
    loop = serve(sched, backend, ListArrivals(requests), clock, end, check_on_idle=True)
    stalled = run_wall_clock(loop, clock, sleep=clock.do_sleep)
    sched.finish_run()
    sched.check_integrity()
    return sched.recorder.build(), clock, backend, stalled


def sparse() -> list[Request]:
    return [Request(i, t, 4, 16, 2) for i, t in enumerate([0.0, 1.0, 2.5])]


@pytest.mark.parametrize("pipelined", [False, True])
def test_the_loop_sleeps_until_each_arrival_and_serves_everyone(pipelined):
    rec, clock, backend, stalled = run(sparse(), pipelined)
    rec.check()
    assert stalled == 0 and (rec.status == 0).all()
    first = np.array([rec.tokens_of(i)[0] for i in range(3)])
    assert np.all(first > rec.arrival_time) and np.all(first - rec.arrival_time < 3 * STEP)
    assert len(clock.sleeps) == 2 and backend.checked == 2  # idle twice, checked each time
    assert clock.sleeps[0] == pytest.approx(1.0 - first[0] - STEP, abs=3 * STEP)


def test_pipelined_ends_are_recorded_when_the_step_is_read():
    rec, _, _, _ = run(sparse(), pipelined=True)
    busy = rec.prefill_tokens + rec.decode_tokens > 0
    # each step's recorded end is when its tokens were read: STEP after it was planned
    np.testing.assert_allclose((rec.step_end - rec.step_start)[busy], STEP)


def test_a_policy_that_admits_nothing_ends_the_run_with_the_stalled_count():
    class Never(Policy):
        def admit(self, req, view):  # noqa: ANN001
            return False

    for pipelined in (False, True):
        _, _, _, stalled = run(sparse(), pipelined, Never())
        assert stalled == 3


def test_end_stops_at_the_first_step_boundary_after_it():
    reqs = [Request(i, 0.0, 4, 64, 40) for i in range(2)]
    rec, clock, _, _ = run(reqs, pipelined=False, end=0.05)
    assert clock.t == pytest.approx(0.05, abs=STEP) and (rec.status == 2).all()
