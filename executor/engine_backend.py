"""The engine as a ``horizon.serving_loop.Backend``: one run's steps on the GPU.

Serially, ``execute`` runs a step, reads its tokens back, applies the stopping rule and
measures it. Pipelined (``EngineConfig.async_steps``), ``submit`` queues a step on the GPU and
returns at once with the requests it finishes (the trace's stopping rule needs no token
values), and ``wait`` reads its tokens, releases its finished requests and takes its end time;
a plan that preempts, or an empty one, first retires the step in flight (``drains_before``:
the runner may not move a row with a token in flight).

Speculative decoding (a plan's ``verifies``): serial only, as the next plan depends on how many
drafts were accepted. Each verifying request may emit at most the stopping rule's tokens left
(the trace's ``true_output_tokens``, or ``max_output_tokens``; with ``stop="eos"`` it also ends
at an end-of-sequence token), and ``StepResult.accepted`` is what it emitted minus one;
``token_ids`` holds its last emitted token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from executor.runner import ModelRunner
from horizon.plan import StepPlan, StepResult
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.serving_loop import InFlight
from horizon.trace_stop import TraceStop
from horizon.wall_clock import WallClock


class EngineBackend:
    """One run's backend. ``outputs[request_id]``: the tokens of each released request."""

    advances_clock = False  # a step's time passes while it runs

    def __init__(
        self,
        runner: ModelRunner,
        sched: Scheduler,
        clock: WallClock,
        pipelined: bool,
        eos: frozenset[int],
        stop: str = "trace",
    ) -> None:
        self.runner = runner
        self.sched = sched
        self.clock = clock
        self.pipelined = pipelined
        self.stop = stop
        self._eos = eos
        self._trace_stop = TraceStop()
        self.outputs: dict[int, list[int]] = {}

    def host_delay(self, step: int, now: float, woke: bool) -> float:
        return 0.0  # the host's work takes real time

    def execute(self, plan: StepPlan) -> StepResult:
        """Run the plan; apply the stopping rule; measure the step."""
        t0 = time.perf_counter()
        if plan.verifies:
            return self._speculative(plan, t0)
        out = self.runner.execute(plan, self.sched.kv.blocks_of)
        if self.stop == "trace":
            finished = self._trace_stop.finished(plan)
        else:
            finished = self._finish_eos(out.requests, out.tokens)
        for r in finished:
            self.outputs[r.request_id] = self.runner.release(r)
        token_ids = dict(zip(out.request_ids, out.tokens))
        return StepResult(time.perf_counter() - t0, tuple(finished), token_ids)

    def _speculative(self, plan: StepPlan, t0: float) -> StepResult:
        """A step that verifies drafts: emit limits from the stopping rule, accepted counts
        from the runner."""
        trace = self.stop == "trace"
        limits = [
            (r.true_output_tokens if trace else r.max_output_tokens) - r.num_output_tokens
            for r, _ in plan.verifies
        ]
        stop_ids = frozenset() if trace else self._eos
        out = self.runner.execute(
            plan, self.sched.kv.blocks_of, emit_limits=limits, stop_ids=stop_ids
        )
        assert out.accepted is not None and out.verified is not None
        if trace:
            finished = self._trace_stop.finished(plan, out.accepted)
        else:
            finished = self._finish_eos(out.requests, out.tokens)
            for (r, _), tokens in zip(plan.verifies, out.verified):
                n = r.num_output_tokens + len(tokens)
                if tokens[-1] in self._eos or n == r.max_output_tokens:
                    finished.append(r)
        for r in finished:
            self.outputs[r.request_id] = self.runner.release(r)
        self._draft_ahead(plan, limits, out.verified, finished)
        token_ids = dict(zip(out.request_ids, out.tokens))
        for (r, _), tokens in zip(plan.verifies, out.verified):
            token_ids[r.request_id] = tokens[-1]
        duration = time.perf_counter() - t0
        return StepResult(duration, tuple(finished), token_ids, accepted=tuple(out.accepted))

    def _draft_ahead(self, plan: StepPlan, limits, verified, finished) -> None:  # noqa: ANN001
        """The verifying requests that go on will most likely verify as many drafts next (or
        what their emit limit leaves): the runner may have their drafts started now."""
        done = {r.request_id for r in finished}
        ahead, ks = [], []
        for (r, k), limit, tokens in zip(plan.verifies, limits, verified):
            k_next = min(k, limit - len(tokens) - 1)
            if k_next > 0 and r.request_id not in done:
                ahead.append(r)
                ks.append(k_next)
        self.runner.draft_ahead(ahead, ks)

    def drains_before(self, plan: StepPlan) -> bool:
        return bool(plan.preempted) or plan.is_empty

    def submit(self, plan: StepPlan) -> InFlight:
        if plan.verifies:
            raise ValueError("EngineBackend: speculative decoding runs serially (pipelined=False)")
        pending = self.runner.submit(plan, self.sched.kv.blocks_of)
        finished = tuple(self._trace_stop.finished(plan))
        return InFlight(plan, StepResult(math.nan, finished), token=pending)

    def wait(self, step: InFlight) -> None:
        """Read the step's tokens, release its finished requests, take its end time."""
        self.runner.wait(step.token)
        step.end = self.clock.now()
        for r in step.result.finished:
            self.outputs[r.request_id] = self.runner.release(r)

    def check_integrity(self) -> None:
        self.runner.check_integrity()

    def _finish_eos(self, emitted: Sequence[Request], tokens: Sequence[int]) -> list[Request]:
        eos = self._eos
        return [
            r
            for r, t in zip(emitted, tokens)
            if t in eos or r.num_output_tokens + 1 == r.max_output_tokens
        ]
