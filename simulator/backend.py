"""The simulator's backend: executes a plan by asking the cost model how long it takes.

Its stopping rule is the trace's: a request stops when it has emitted ``true_output_tokens``.
In event mode it keeps a calendar of the step at which each decoding request will emit its last
token (set when its prefill completes, dropped when it is preempted), so a step costs O(events).
The reference mode checks every decode at every step.
"""

from __future__ import annotations

from horizon.plan import StepPlan, StepResult
from horizon.request import Request
from simulator.cost_model import CostModel


class SimBackend:
    """``execute(plan) -> StepResult``; never touches scheduler state."""

    def __init__(self, cost_model: CostModel, event_mode: bool = True) -> None:
        self.cost_model = cost_model
        self.event_mode = event_mode
        self._finish_at: dict[int, int] = {}  # request id -> step of its last token
        self._calendar: dict[int, list[Request]] = {}

    def execute(self, plan: StepPlan) -> StepResult:
        t = plan.step
        finished: list[Request] = []
        for r in plan.preempted:
            self._finish_at.pop(r.request_id, None)
        for r, n in plan.prefills:
            if r.num_computed_tokens + n == r.num_tokens:  # the chunk ends a prefill: a token
                left = r.true_output_tokens - r.num_output_tokens - 1
                if left == 0:
                    finished.append(r)
                elif self.event_mode:
                    self._finish_at[r.request_id] = t + left
                    self._calendar.setdefault(t + left, []).append(r)
        if self.event_mode:
            due = self._calendar.pop(t, ())
            finish_at = self._finish_at
            for r in due:
                if finish_at.get(r.request_id) == t:
                    del finish_at[r.request_id]
                    finished.append(r)
        else:
            finished.extend(
                r for r in plan.decodes if r.num_output_tokens + 1 == r.true_output_tokens
            )
        return StepResult(duration=self.cost_model.step_time(plan), finished=tuple(finished))
