"""Replay an engine run's measured step clock through the simulator (step-level parity).

``ReplayCostModel.from_records(engine_records)`` gives step ``k`` the duration that makes it end
at the engine's recorded ``step_end[k]``; through the Simulation's ``wake_delay`` hook it delays
the first step after the start or an idle sleep to the recorded ``step_start[k]``: the engine
plans a little after the arrival that woke it (its wake-up lag), and sees every arrival that
landed meanwhile. Between busy steps there is no delay, so a step planned at any time other
than its recorded start (the clock or the plans went astray) is caught at once.

Run it as ``Simulation(..., cost_model=replay, arrivals_at_step_boundaries=True)`` (the engine
queues arrivals between steps, which a step's recorded ``num_waiting`` shows): the simulation
then makes the engine's plans at the engine's times, and its records equal the engine's
(``tests/test_step_parity.py``, on the golden log in ``tests/data/golden``).

A pipelined engine's log (``EngineConfig.async_steps``: step ``k + 1`` planned while step ``k``
runs, so ``step_start[k + 1] < step_end[k]``) replays with ``pipelined=True`` through
``Simulation(pipelined=True)``, which consults ``wake_delay`` before every plan (the engine's host
work between reading one step and planning the next): step ``k`` then takes
``step_end[k] - max(step_start[k], step_end[k - 1])``, from when the step before it ends.

It is not a model: it answers only for the run it was built from, and it raises
``ReplayMismatch`` as soon as the simulation leaves that run (a plan beyond the log, or planned
at a time other than the recorded start) instead of drifting silently.
"""

from __future__ import annotations

import math

import numpy as np

from horizon.metrics.records import RunRecords
from horizon.plan import StepPlan


class ReplayMismatch(RuntimeError):
    """The simulated run left the replayed log (a different step count or clock)."""


class ReplayCostModel:
    """Step ``k`` ends at ``step_end[k]``; step ``k`` is planned at ``step_start[k]``.

    Args:
        step_start, step_end: the engine's per-step clock (seconds since the run start).
        tol: how far (seconds) a plan's time may be from the recorded start.
        pipelined: the log is a pipelined engine's (steps planned before the previous one
            ended); replay it with ``Simulation(pipelined=True)``.
    """

    def __init__(
        self,
        step_start: np.ndarray,
        step_end: np.ndarray,
        tol: float = 1e-9,
        pipelined: bool = False,
    ) -> None:
        start = np.asarray(step_start, dtype=np.float64)
        end = np.asarray(step_end, dtype=np.float64)
        if start.ndim != 1 or start.shape != end.shape:
            raise ValueError(
                f"step_start and step_end must be 1-D of one length, got {start.shape} and "
                f"{end.shape}"
            )
        if not (np.all(np.isfinite(start)) and np.all(np.isfinite(end))):
            raise ValueError("step times must be finite")
        if np.any(start < 0) or np.any(end < start):
            raise ValueError("step times must satisfy 0 <= start[k] <= end[k]")
        if pipelined:
            if np.any(end[1:] < end[:-1]) or np.any(start[1:] < start[:-1]):
                raise ValueError("a pipelined log's starts and ends must not decrease")
        elif np.any(start[1:] < end[:-1]):
            raise ValueError(
                "step times must satisfy end[k] <= start[k + 1] (overlapping steps: a pipelined "
                "log, give pipelined=True)"
            )
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
        self._start = start.tolist()  # Python floats: exact, and cheap to index
        self._end = end.tolist()
        self.tol = tol
        self.pipelined = pipelined
        self.steps_planned = 0  # steps asked for so far (see check_complete)

    @classmethod
    def from_records(
        cls, records: RunRecords, tol: float = 1e-9, pipelined: bool = False
    ) -> ReplayCostModel:
        return cls(records.step_start, records.step_end, tol, pipelined)

    @property
    def num_steps(self) -> int:
        return len(self._start)

    def _recorded_start(self, step: int, now: float) -> float:
        if not 0 <= step < len(self._start):
            raise ReplayMismatch(
                f"step {step} planned at t={now!r}, but the log has {len(self._start)} steps"
            )
        start = self._start[step]
        if now > start + self.tol:
            raise ReplayMismatch(
                f"step {step}: simulated clock t={now!r} is past the recorded start {start!r} "
                f"(by {now - start:.3g} s)"
            )
        return start

    def wake_delay(self, step: int, now: float) -> float:
        """Seconds from waking at ``now`` to planning ``step`` (the Simulation's hook)."""
        return max(0.0, self._recorded_start(step, now) - now)

    def step_time(self, plan: StepPlan) -> float:
        k = plan.step
        start = self._recorded_start(k, plan.time)
        if abs(plan.time - start) > self.tol:
            raise ReplayMismatch(
                f"step {k}: planned at t={plan.time!r}, recorded start {start!r} "
                f"(off by {plan.time - start:.3g} s)"
            )
        self.steps_planned = max(self.steps_planned, k + 1)
        begin = plan.time
        if self.pipelined and k > 0:
            begin = max(begin, self._end[k - 1])  # it runs once the step before it ended
        return max(0.0, self._end[k] - begin)

    def check_complete(self) -> None:
        """Raise ``ReplayMismatch`` unless every logged step was planned."""
        if self.steps_planned != len(self._start):
            raise ReplayMismatch(
                f"the simulation planned {self.steps_planned} steps, the log has {len(self._start)}"
            )
