"""The SimPy twin: an arrival process and an engine process around horizon's Scheduler.

The engine process is the serving loop both backends run (``horizon.serving_loop.serve``):
``plan = scheduler.schedule(now)`` -> the step's modelled cost passes (``env.timeout``) ->
``scheduler.update(plan, result, now)``; it sleeps on an event when it has nothing to do (no
polling) and the arrival process wakes it. All policy and block logic is the Scheduler's.

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

from horizon.acceptance import AcceptanceModel
from horizon.metrics.records import RunRecords
from horizon.policies.base import Policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.serving_loop import serve
from simulator.backend import SimBackend
from simulator.cost_model import CostModel
from simulator.trace_draws import TraceDraws
from simulator.verification_cost import DraftCost, SpeculativeCostModel, VerifyCost


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
        acceptance: with speculation on (``config.speculation``), the stated acceptance model
            that decides how many drafts each verification accepts (required then).
        draft_cost: with speculation on, what drafting costs per step (default: model-free,
            0).
        verify_cost: with speculation on, the shape ``cost_model`` prices verification steps
            in and their fitted host terms (default: expanded decode rows, as the engine runs
            them by default, no host terms; ``simulator.verification_cost``).
        draws_ahead: in event mode with a steady speculation policy, the scheduler draws the
            acceptance ahead (``horizon.drawn_speculation``; the same plans and records);
            False: per step, as the engine's scheduler does.
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
        acceptance: AcceptanceModel | None = None,
        draft_cost: DraftCost | None = None,
        verify_cost: VerifyCost | None = None,
        draws_ahead: bool = True,
    ) -> None:
        if config.speculation is not None:
            if acceptance is None:
                raise ValueError(
                    "Simulation.acceptance: SchedulerConfig.speculation is set, so an "
                    "acceptance model is needed (horizon.acceptance.AcceptanceModel)"
                )
            cost_model = SpeculativeCostModel(cost_model, draft_cost, verify_cost)
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0, got {max_time!r}")
        self.env = simpy.Environment()
        self.clock = SimClock(self.env)
        draws = None  # the backend accepts exactly these draws: the scheduler may use them
        if draws_ahead and acceptance is not None:
            draws = TraceDraws(acceptance, requests)
        self.scheduler = Scheduler(config, policy, draws=draws)
        self.backend = SimBackend(
            cost_model,
            config.step_mode == "event",
            self.clock,
            pipelined=pipelined,
            acceptance=acceptance,
            drawn=self.scheduler.draws_ahead,
        )
        self.max_time = max_time
        self.arrivals = SimArrivals(self.env, requests, max_time, arrivals_at_step_boundaries)
        self.check_every = check_every
        self.stalled = 0  # requests left waiting when nothing could ever run them

    def run(self) -> RunRecords:
        env = self.env
        env.process(self.arrivals.process(self.scheduler))
        end = math.inf if self.max_time is None else self.max_time
        loop = serve(self.scheduler, self.backend, self.arrivals, self.clock, end, self.check_every)
        engine = env.process(self._engine(loop))
        # The run and its records allocate millions of short-lived objects and no garbage
        # cycles of their own; the cyclic collector would only rescan the caller's heap (a
        # tokenised corpus, say).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run(until=engine)
            self.scheduler.finish_run()
            self.scheduler.check_integrity()
            return self.scheduler.recorder.build()
        finally:
            if was_enabled:
                gc.enable()

    def _engine(self, loop):  # noqa: ANN001, ANN202 - a SimPy process around the loop
        self.stalled = yield from loop


class SimClock:
    """The SimPy environment's clock; a waitable is a SimPy timeout."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def now(self) -> float:
        return self.env.now

    def sleep(self, seconds: float) -> simpy.Event:
        return self.env.timeout(seconds)

    def until(self, t: float) -> simpy.Event:
        return self.env.timeout(t - self.env.now)


class SimArrivals:
    """Requests handed to the scheduler by a SimPy process at their arrival times: at once, or
    (``hold``) queued until the serving loop's next step boundary, as the engine does."""

    def __init__(
        self,
        env: simpy.Environment,
        requests: Sequence[Request],
        max_time: float | None,
        hold: bool,
    ) -> None:
        self.env = env
        self.requests = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self.end = math.inf if max_time is None else max_time
        self.hold = hold
        self.held: list[Request] = []  # arrived, queued at the next step boundary
        self.done = False
        self._wake: simpy.Event | None = None

    def process(self, sched: Scheduler):  # noqa: ANN201 - a SimPy process
        env = self.env
        for r in self.requests:
            if r.arrival_time > self.end:
                break
            dt = r.arrival_time - env.now
            if dt > 0:
                yield env.timeout(dt)
            if self.hold:
                self.held.append(r)
            else:
                sched.add(r)
            self._notify()
        self.done = True
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def admit(self, sched: Scheduler, now: float) -> None:
        if self.held:
            for r in self.held:
                sched.add(r)
            self.held.clear()

    def due(self, now: float) -> bool:
        return bool(self.held)

    @property
    def exhausted(self) -> bool:
        return self.done and not self.held

    def wait(self, now: float, end: float) -> simpy.Event:
        self._wake = self.env.event()
        return self._wake
