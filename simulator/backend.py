"""The simulator's backend: executes a plan by asking the cost model how long it takes.

Its stopping rule is the trace's (``horizon.trace_stop``): a request stops when it has emitted
``true_output_tokens``.
"""

from __future__ import annotations

from horizon.plan import StepPlan, StepResult
from horizon.trace_stop import TraceStop
from simulator.cost_model import CostModel


class SimBackend:
    """``execute(plan) -> StepResult``; never touches scheduler state."""

    def __init__(self, cost_model: CostModel, event_mode: bool = True) -> None:
        self.cost_model = cost_model
        self._stop = TraceStop(event_mode)

    def execute(self, plan: StepPlan) -> StepResult:
        finished = self._stop.finished(plan)
        return StepResult(duration=self.cost_model.step_time(plan), finished=tuple(finished))
