"""The replay stopping rule: a request stops when it has emitted its trace's output length.

Shared by the simulator's backend and the engine (forced lengths, end-of-sequence ignored).
In event mode it keeps a calendar of the step at which each decoding request will emit its last
token (set when its prefill completes, dropped when it is preempted), so a step costs
O(events); the reference mode checks every decode at every step.

A verifying request (speculative decoding) emits its accepted drafts plus one token at a step:
``cap`` limits the accepted counts to what the trace has left, and ``finished`` drops such a
request's calendar entry and sets a new one as if it decoded plainly from the next step on
(dropped again if it verifies again).
"""

from __future__ import annotations

from collections.abc import Sequence

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

    @staticmethod
    def cap(verifies: Sequence[tuple[Request, int]], accepted: Sequence[int]) -> list[int]:
        """``accepted`` (per verify, ``0..k``) limited to the trace's tokens left: a request
        emits ``accepted + 1`` tokens, at most its ``true_output_tokens``."""
        return [
            min(int(a), r.true_output_tokens - r.num_output_tokens - 1)
            for (r, _), a in zip(verifies, accepted)
        ]

    def finished(self, plan: StepPlan, accepted: Sequence[int] = ()) -> list[Request]:
        """``accepted``: the capped counts of the plan's verifies (``cap``), in its order."""
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
        if plan.verifies:
            self._verified(plan, accepted, done)
        if self.event_mode:
            finish_at = self._finish_at
            for r in self._calendar.pop(t, ()):
                if finish_at.get(r.request_id) == t:
                    del finish_at[r.request_id]
                    done.append(r)
        else:
            done.extend(r for r in plan.decodes if r.num_output_tokens + 1 == r.true_output_tokens)
        return done

    def _verified(self, plan: StepPlan, accepted: Sequence[int], done: list[Request]) -> None:
        t, finish_at = plan.step, self._finish_at
        for (r, _), a in zip(plan.verifies, accepted):
            finish_at.pop(r.request_id, None)
            left = r.true_output_tokens - r.num_output_tokens - a - 1
            if left == 0:
                done.append(r)
            elif self.event_mode:  # its last token, were it to decode plainly from t + 1
                finish_at[r.request_id] = t + left
                self._calendar.setdefault(t + left, []).append(r)
