"""The replay stopping rule: a request stops when it has emitted its trace's output length.

Shared by the simulator's backend and the engine (forced lengths, end-of-sequence ignored).
In event mode it keeps a calendar of the step at which each decoding request will emit its last
token (set when its prefill completes, dropped when it is preempted), so a step costs
O(events); the reference mode checks every decode at every step.
"""

from __future__ import annotations

from horizon.plan import StepPlan
from horizon.request import Request


class TraceStop:
    """``finished(plan)``: the plan's requests that emit their last trace token in this step.

    Call once per executed plan, in order, before ``Scheduler.update`` (it reads the
    pre-update counters).
    """

    def __init__(self, event_mode: bool = True) -> None:
        self.event_mode = event_mode
        self._finish_at: dict[int, int] = {}  # request id -> step of its last token
        self._calendar: dict[int, list[Request]] = {}

    def finished(self, plan: StepPlan) -> list[Request]:
        t = plan.step
        done: list[Request] = []
        for r in plan.preempted:
            self._finish_at.pop(r.request_id, None)
        for r, n in plan.prefills:
            if r.num_computed_tokens + n == r.num_tokens:  # the chunk ends a prefill: a token
                left = r.true_output_tokens - r.num_output_tokens - 1
                if left == 0:
                    done.append(r)
                elif self.event_mode:
                    self._finish_at[r.request_id] = t + left
                    self._calendar.setdefault(t + left, []).append(r)
        if self.event_mode:
            finish_at = self._finish_at
            for r in self._calendar.pop(t, ()):
                if finish_at.get(r.request_id) == t:
                    del finish_at[r.request_id]
                    done.append(r)
        else:
            done.extend(r for r in plan.decodes if r.num_output_tokens + 1 == r.true_output_tokens)
        return done
