"""A backend wrapper that tells its replica of every step once the step's end is known.

It wraps any ``horizon.serving_loop.Backend`` and changes nothing about how steps run. A step's
end is known at ``execute`` (a modelled duration on an advancing clock, or a real step that is
over), at ``submit`` when the backend models it (the pipelined simulator), or else at ``wait``
(the pipelined engine), or once the waitable ``wait`` returns is over (the simulator on a
device whose turns it simulates: the backend's ``when_over``). ``on_step(plan, result, end)``
is then called once per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from horizon.plan import StepPlan, StepResult
from horizon.serving_loop import Backend, Clock, InFlight

StepObserver = Callable[[StepPlan, StepResult, float], None]


class ObservedBackend:
    """``inner`` with ``on_step`` called once per step at its end (see the module docstring)."""

    def __init__(self, inner: Backend, clock: Clock, on_step: StepObserver) -> None:
        self.inner = inner
        self.clock = clock
        self.on_step = on_step
        self.pipelined = inner.pipelined
        self.advances_clock = inner.advances_clock

    def host_delay(self, step: int, now: float, woke: bool) -> float:
        return self.inner.host_delay(step, now, woke)

    def execute(self, plan: StepPlan) -> StepResult:
        result = self.inner.execute(plan)
        end = self.clock.now()
        if self.advances_clock:
            end += max(result.duration, 0.0)
        self.on_step(plan, result, end)
        return result

    def drains_before(self, plan: StepPlan) -> bool:
        return self.inner.drains_before(plan)

    def submit(self, plan: StepPlan) -> InFlight:
        step = self.inner.submit(plan)
        if step.end is not None:
            self.on_step(plan, step.result, step.end)
        return step

    def wait(self, step: InFlight) -> Any:
        known = step.end is not None
        waitable = self.inner.wait(step)
        if known:
            return waitable
        if step.end is None:  # known once the waitable is over (a simulated shared device's)
            when_over = getattr(self.inner, "when_over", None)
            assert when_over is not None and waitable is not None, (
                "a backend's wait() must set the step's end or say when it will be set"
            )
            when_over(waitable, lambda: self.on_step(step.plan, step.result, step.end))
        else:
            self.on_step(step.plan, step.result, step.end)
        return waitable

    def check_integrity(self) -> None:
        self.inner.check_integrity()
