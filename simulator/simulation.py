"""The SimPy twin: an arrival process and an engine process around horizon's Scheduler.

The engine loops ``plan = scheduler.schedule(now)`` -> ``yield env.timeout(cost)`` ->
``scheduler.update(plan, result, now)``, and sleeps on an event when it has nothing to do (no
polling); the arrival process wakes it. All policy and block logic is the Scheduler's.

Two optional refinements make it follow the engine's loop (``executor/engine.py``) exactly, for
replaying an engine's log (``simulator.replay_cost_model``):

* ``arrivals_at_step_boundaries=True``: an arrival during a step is handed to the Scheduler after
  that step's ``update``, as the engine (which checks for arrivals between steps) does, instead
  of at its arrival instant; plans are the same either way, but a step's recorded
  ``num_waiting`` then excludes requests that arrived while it ran, as the engine's does.
* ``pipelined=True``: the engine's pipelined loop (``EngineConfig.async_steps``): it plans a
  step while the one before it still runs, so a plan made at the end of step k runs after step
  k+1, and an arrival reaches the GPU one step later than in the serial loop while no host time
  separates steps. Each step still costs the cost model's duration, starting when the step
  before it ends; the plan is made when the step in flight before that one ended (or at once
  when none is in flight). Recorded step starts are the planning times, as the engine's are.
  A cost model's ``wake_delay`` (below) is then consulted before every plan, not only on
  waking: the engine's host work between reading a step and planning the next.
* a cost model with a ``wake_delay(step, now) -> float`` method: when the engine starts or wakes
  from an idle sleep at ``now``, it waits that many seconds before planning ``step`` (arrivals
  meanwhile are seen by the plan): the real engine's wake-up lag. Without the method, or between
  busy steps, there is no delay.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence

import simpy

from horizon.metrics.records import RunRecords
from horizon.policies.base import Policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from simulator.backend import SimBackend
from simulator.cost_model import CostModel


class Simulation:
    """One simulated run. ``run()`` returns the records; the object is single-use.

    Args:
        requests: fresh (never scheduled) requests; any order (arrivals are sorted).
        max_time: stop at the first step boundary at or after this simulated time; requests
            that arrived by then and did not finish are recorded as unfinished, later ones are
            not part of the run. None runs until every request is done.
        check_every: call ``scheduler.check_integrity()`` every this many steps (0: only at end).
        arrivals_at_step_boundaries: queue arrivals between steps, as the engine does (see the
            module docstring); False: at their arrival instant.
        pipelined: plan each step while the previous one runs, as the pipelined engine does
            (see the module docstring).
    """

    def __init__(
        self,
        requests: Sequence[Request],
        config: SchedulerConfig,
        policy: Policy,
        cost_model: CostModel,
        max_time: float | None = None,
        check_every: int = 0,
        arrivals_at_step_boundaries: bool = False,
        pipelined: bool = False,
    ) -> None:
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0, got {max_time!r}")
        self.requests = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self.scheduler = Scheduler(config, policy)
        self.backend = SimBackend(cost_model, event_mode=config.step_mode == "event")
        self.max_time = max_time
        self.check_every = check_every
        self.env = simpy.Environment()
        self._wake: simpy.Event | None = None
        self._arrivals_done = False
        self._wake_delay = getattr(cost_model, "wake_delay", None)
        self._hold = arrivals_at_step_boundaries
        self._pipelined = pipelined
        self._held: list[Request] = []  # arrived, queued at the next step boundary
        self.stalled = 0  # requests left waiting when nothing could ever run them

    def run(self) -> RunRecords:
        env = self.env
        env.process(self._arrivals())
        engine = env.process(self._engine())
        # The run allocates millions of short-lived objects and no garbage cycles of its own;
        # the cyclic collector would only rescan the caller's heap (a tokenised corpus, say).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run(until=engine)
        finally:
            if was_enabled:
                gc.enable()
        self.scheduler.finish_run()
        self.scheduler.check_integrity()
        return self.scheduler.recorder.build()

    def _arrivals(self):  # noqa: ANN202 - a SimPy process
        env, sched = self.env, self.scheduler
        end = math.inf if self.max_time is None else self.max_time
        for r in self.requests:
            if r.arrival_time > end:
                break
            dt = r.arrival_time - env.now
            if dt > 0:
                yield env.timeout(dt)
            if self._hold:
                self._held.append(r)
            else:
                sched.add(r)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()
        self._arrivals_done = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _engine(self):  # noqa: ANN202 - a SimPy process
        env, sched, backend = self.env, self.scheduler, self.backend
        check_every = self.check_every
        end = math.inf if self.max_time is None else self.max_time
        held, wake_delay = self._held, self._wake_delay
        woke = True  # the run's start counts as a wake-up
        pipelined = self._pipelined
        flight_end: float | None = None  # pipelined: when the step in flight ends
        while env.now < end:
            if held:
                self._add_held()
            if not sched.has_work:
                if flight_end is not None:  # the engine reads the last step's tokens
                    yield from self._until(flight_end)
                    flight_end = None
                    continue
                if self._arrivals_done:
                    return
                yield from self._sleep()
                woke = True
                continue
            if (woke or pipelined) and wake_delay is not None:
                delay = wake_delay(sched.clock.step, env.now)
                if delay > 0:
                    yield env.timeout(delay)
                    if held:
                        self._add_held()
            woke = False
            plan = sched.schedule(env.now)
            result = backend.execute(plan)
            if pipelined:
                start = env.now if flight_end is None else max(env.now, flight_end)
                step_end = start + max(result.duration, 0.0)
                sched.update(plan, result, step_end)
                if flight_end is not None:
                    yield from self._until(flight_end)
                flight_end = None if plan.is_empty else step_end
            else:
                if result.duration > 0:
                    yield env.timeout(result.duration)
                sched.update(plan, result, env.now)
            if check_every and plan.step % check_every == 0:
                sched.check_integrity()
            if plan.is_empty and not sched.running:  # the policy admits nothing until an arrival
                if held:
                    continue
                if self._arrivals_done:
                    self.stalled = sched.num_waiting
                    return
                yield from self._sleep()
                woke = True

    def _until(self, t: float):  # noqa: ANN202
        if t > self.env.now:
            yield self.env.timeout(t - self.env.now)

    def _add_held(self) -> None:
        for r in self._held:
            self.scheduler.add(r)
        self._held.clear()

    def _sleep(self):  # noqa: ANN202
        self._wake = self.env.event()
        yield self._wake
        self._wake = None
