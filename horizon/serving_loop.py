"""The one loop that serves a run: ``schedule -> execute -> update``, on any backend and clock.

Both backends run this loop: the simulator (modelled step times, a SimPy clock) and the engine
(measured step times, the wall clock). What differs is behind four small contracts:

* ``Backend``: how a step runs. Serially, ``execute(plan) -> StepResult`` returns when the
  step is done; a backend that models time rather than spending it (``advances_clock``) has
  the loop wait ``result.duration`` on the clock. Pipelined (``pipelined``): ``submit(plan)``
  starts a step and returns an ``InFlight`` at once, and ``wait(step)`` blocks until its tokens
  are out (or returns a waitable for the clock); the loop plans step N+1 while step N runs.
* ``Arrivals``: where requests come from and when (a SimPy process, or a list replayed on
  the wall clock).
* ``Clock``: ``now()``, and ``sleep(seconds)`` / ``until(t)``, which return a *waitable*.
* the driver: the loop is a generator that yields those waitables. SimPy runs it as a process
  (a waitable is a SimPy event); ``horizon.wall_clock.run_wall_clock`` runs it on real time (a
  waitable is a deadline to sleep until). So the loop itself never blocks on a clock.

Pipelined loop (as the engine's): a step planned while the previous one runs is submitted, then
the scheduler is updated with its finished requests (known from the plan under the trace's
stopping rule), then the previous step is waited for. A backend whose ``InFlight.end`` is known
at submit (the simulator's modelled end) records it at once; otherwise the recorded end is set
when the step is waited for. A backend may need the step in flight retired before it submits
a plan (``drains_before``: the engine, for a plan that preempts or is empty).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from horizon.plan import StepPlan, StepResult
from horizon.scheduler import Scheduler

Waits = Generator[Any, Any, int]  # yields waitables; returns the number of stalled requests


@dataclass(slots=True, eq=False)
class InFlight:
    """A submitted step: its plan, its result as known at submit, and its end once known."""

    plan: StepPlan
    result: StepResult
    end: float | None = None  # known at submit (modelled), or set by ``Backend.wait``
    late_end: bool = True  # the end is recorded when the step is waited for
    token: Any = None  # the backend's own handle


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> Any:
        """A waitable that is over ``seconds`` from now."""

    def until(self, t: float) -> Any:
        """A waitable that is over at time ``t`` (> now)."""


class Arrivals(Protocol):
    def admit(self, scheduler: Scheduler, now: float) -> None:
        """Add to ``scheduler`` every request that is due by ``now`` and not yet added."""

    def due(self, now: float) -> bool:
        """Whether a request is due by ``now`` and waits to be added."""

    @property
    def exhausted(self) -> bool:
        """No request will arrive any more (and none waits to be added)."""

    def wait(self, now: float, end: float) -> Any:
        """A waitable that is over when a request arrives, or at ``end``."""


class Backend(Protocol):
    pipelined: bool  # submit/wait, else execute
    advances_clock: bool  # execute's duration passes on the clock (a model, not real work)

    def host_delay(self, step: int, now: float, woke: bool) -> float:
        """Seconds of host work before planning ``step`` (a modelled wake-up lag; 0 for a real
        backend, whose host work takes its own time)."""

    # Optional: ``held() -> waitable | None``, work the host waits on before its next plan whose
    # end is not known yet (the simulator's KV copies on a late-end device); None or absent:
    # nothing. Consulted after ``host_delay``, only where the backend has it set.

    def execute(self, plan: StepPlan) -> StepResult: ...

    def drains_before(self, plan: StepPlan) -> bool:
        """Whether the step in flight must be retired before ``plan`` is submitted."""

    def submit(self, plan: StepPlan) -> InFlight: ...

    def wait(self, step: InFlight) -> Any:
        """Until ``step`` is done: block (and return None), or return a waitable; either way
        ``step.end`` is set when it is over."""

    def check_integrity(self) -> None: ...


def serve(
    sched: Scheduler,
    backend: Backend,
    arrivals: Arrivals,
    clock: Clock,
    end: float = math.inf,
    check_every: int = 0,
    check_on_idle: bool = False,
    check: Callable[[], None] | None = None,
    after_update: Callable[[], None] | None = None,
) -> Waits:
    """Serve ``arrivals`` until all are done, nothing can ever run, or ``end`` (the first step
    boundary at or after it). ``check_every``: ``check()`` (default
    ``sched.check_integrity``) every that many steps, after the step's update;
    ``check_on_idle``: the scheduler's and the backend's whenever the loop goes idle;
    ``after_update()``: once per step, after its update (a cluster collects handoffs).
    Returns the number of requests left waiting that nothing could ever run (stalled)."""
    loop = _Loop(sched, backend, arrivals, clock, check_every, check_on_idle)
    if check is not None:
        loop.check = check
    loop.after_update = after_update
    return (yield from loop.run(end))


class _Loop:
    def __init__(self, sched, backend, arrivals, clock, check_every, check_on_idle) -> None:  # noqa: ANN001
        self.sched, self.backend, self.arrivals, self.clock = sched, backend, arrivals, clock
        self.check_every, self.check_on_idle = check_every, check_on_idle
        self.check = sched.check_integrity
        self.after_update: Callable[[], None] | None = None
        self._empty_step = -2  # the step of the last empty plan planned again at once

    # ``t`` is read from the clock once after each step (and each wait) and planned with, as a
    # real engine reads its clock: the next plan is made at the time the last step's update saw.

    def run(self, end: float) -> Waits:
        sched, backend, arrivals, now = self.sched, self.backend, self.arrivals, self.clock.now
        host_delay, advances = backend.host_delay, backend.advances_clock
        held = getattr(backend, "held", None)
        check_every, pipelined, after = self.check_every, backend.pipelined, self.after_update
        woke = True  # the run's start counts as a wake-up
        flight: InFlight | None = None  # pipelined: the step submitted and not yet read
        t = now()
        while t < end:
            arrivals.admit(sched, t)
            if not sched.has_work:
                if flight is not None:  # read the last step's tokens
                    yield from self._retire(flight)
                    flight, t = None, now()
                    continue
                if arrivals.exhausted:
                    return 0
                yield from self._idle(end)
                t, woke = now(), True
                continue
            delay = host_delay(sched.clock.step, t, woke)
            if delay > 0:  # (a generator only here: the hot path stays free of them)
                t = yield from self._host_work(delay)
            if held is not None and (waitable := held()) is not None:
                t = yield from self._host_work(0.0, waitable)
            woke = False
            plan = sched.schedule(t)
            empty = plan.is_empty
            if not pipelined:
                result = backend.execute(plan)
                if advances and result.duration > 0:
                    yield self.clock.sleep(result.duration)
                t = now()
                sched.update(plan, result, t)
            else:
                if flight is not None and backend.drains_before(plan):
                    yield from self._retire(flight)
                    flight = None
                step = backend.submit(plan)
                sched.update(plan, step.result, now() if step.end is None else step.end)
                if flight is not None:  # the step before: inline, as it is every step's
                    waitable = backend.wait(flight)
                    if waitable is not None:
                        yield waitable
                    if flight.late_end:
                        sched.recorder.set_step_end(flight.plan.step, flight.end)
                flight = step
                if empty:
                    yield from self._retire(flight)
                    flight = None
                t = now()
            if after is not None:
                after()
            if check_every and plan.step % check_every == 0:
                self.check()
            if empty and not sched.running:  # nothing is admitted until an arrival
                stalled, slept = yield from self._until_admissible(t, end, plan.step)
                if stalled is not None:
                    return stalled
                if slept:
                    t, woke = now(), True
        if flight is not None:
            yield from self._retire(flight)
        return 0

    def _retire(self, step: InFlight) -> Generator[Any, Any, None]:
        waitable = self.backend.wait(step)
        if waitable is not None:
            yield waitable
        if step.late_end:
            self.sched.recorder.set_step_end(step.plan.step, step.end)

    def _host_work(self, delay: float, waitable: Any = None) -> Generator[Any, Any, float]:
        """Wait out ``delay`` s of modelled host work (or ``waitable``) before a plan; returns
        the time after."""
        yield self.clock.sleep(delay) if waitable is None else waitable
        t = self.clock.now()
        self.arrivals.admit(self.sched, t)
        return t

    def _until_admissible(
        self, t: float, end: float, step: int
    ) -> Generator[Any, Any, tuple[int | None, bool]]:
        """The policy admitted nothing and nothing runs: plan once more at once unless the
        previous plan was such an empty one too (a policy may hold one admission pass, as
        vLLM's does after a preemption); go on at once if an arrival is due, stop if none
        will come (``(stalled count, False)``), else sleep until one does.
        Returns ``(stalled count or None, whether it slept)``."""
        if self._empty_step != step - 1:
            self._empty_step = step
            return None, False
        if self.arrivals.due(t):
            return None, False
        if self.arrivals.exhausted:
            return self.sched.num_waiting, False
        yield from self._idle(end)
        self._empty_step = -2  # after a sleep, an empty plan is first made again
        return None, True

    def _idle(self, end: float) -> Generator[Any, Any, None]:
        if self.check_on_idle:
            self.sched.check_integrity()
            self.backend.check_integrity()
        yield self.arrivals.wait(self.clock.now(), end)
