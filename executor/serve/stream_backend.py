"""The engine's backend for live serving: per-request stopping rules and token events.

It is ``executor.engine_backend.EngineBackend`` run serially (the stopping rules read every
token's value, so a step is read back before the next is planned), with the stopping rule of
each request's ``Generation`` instead of a run-wide one, and each step's events handed to
``publish`` in one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from executor.engine_backend import EngineBackend
from executor.runner import ModelRunner
from executor.serve.events import Event, first_tokens_first
from executor.serve.generation import Generation
from horizon.plan import StepPlan, StepResult
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.wall_clock import WallClock

Publish = Callable[[list[Event]], None]


class StreamBackend(EngineBackend):
    """``generations[request_id]`` for every request the scheduler holds (waiting or running).

    Contracts:
        * ``add`` a request's generation before the scheduler sees the request.
        * ``forget`` the scheduler's aborted requests (``take_aborted``) at a step boundary.
        * ``flush`` hands the events collected since the last flush to ``publish``; its owner
          flushes after each step's update (``LiveEngine``'s ``after_update``), so that a
          token reaches ``publish`` after the records have stamped it.
    """

    def __init__(
        self, runner: ModelRunner, sched: Scheduler, clock: WallClock, publish: Publish
    ) -> None:
        super().__init__(runner, sched, clock, pipelined=False, eos=frozenset(), stop="eos")
        self.generations: dict[int, Generation] = {}
        self.num_preemptions = 0
        self._publish = publish
        self._events: list[Event] = []

    def add(self, generation: Generation) -> None:
        assert generation.request_id not in self.generations
        self.generations[generation.request_id] = generation

    def execute(self, plan: StepPlan) -> StepResult:
        """Run the plan; each emitted token goes through its request's stopping rule (a
        verification's tokens one by one, up to the first that ends the request: its accepted
        count is what was kept)."""
        t0 = time.perf_counter()
        self.num_preemptions += len(plan.preempted)
        gens = self.generations
        limits = [gens[r.request_id].tokens_left for r, _ in plan.verifies]
        out = self.runner.execute(plan, self.sched.kv.blocks_of, emit_limits=limits or None)
        now = time.perf_counter()
        events, finished = self._events, []
        for r, token in zip(out.requests, out.tokens):
            event = gens[r.request_id].push(token, now)
            events.append(event)
            if event.finish_reason is not None:
                finished.append(r)
        accepted = None
        if plan.verifies:
            accepted = self._verified(plan, out.verified, now, finished)
        for r in finished:
            self.runner.release(r)
            del gens[r.request_id]
        return StepResult(time.perf_counter() - t0, tuple(finished), accepted=accepted)

    def _verified(self, plan: StepPlan, verified, now: float, finished: list) -> tuple[int, ...]:  # noqa: ANN001
        """Each verification's tokens through its generation; the accepted counts kept."""
        accepted = []
        for (r, _), tokens in zip(plan.verifies, verified):
            gen, kept = self.generations[r.request_id], 0
            for token in tokens:
                kept += 1
                event = gen.push(token, now)
                self._events.append(event)
                if event.finish_reason is not None:
                    finished.append(r)
                    break
            accepted.append(kept - 1)
        return tuple(accepted)

    def end(self, requests: Iterable[Request], reason: str, now: float, error: str = "") -> None:
        """Requests that left the scheduler without finishing (aborted, rejected): the runner
        drops them, their handlers get a last event."""
        for r in requests:
            self.runner.drop(r)
            gen = self.generations.pop(r.request_id)
            self._events.append(gen.end(reason, now, error))

    def fail_all(self, error: str) -> None:
        """The engine stopped: every request still held ends with an error."""
        now = time.perf_counter()
        self._events.extend(g.end("error", now, error) for g in self.generations.values())
        self.generations.clear()
        self.flush()

    def flush(self) -> None:
        """The events so far to ``publish``: the requests' first tokens in one call, then
        the rest (``first_tokens_first``)."""
        if self._events:
            events, self._events = self._events, []
            for part in first_tokens_first(events):
                if part:
                    self._publish(part)

    def check_integrity(self) -> None:
        """The runner's own checks, and one generation for each request the scheduler holds."""
        self.runner.check_integrity()
        sched, gens = self.sched, self.generations
        assert all(rid in gens for rid in sched.running), "a running request has no generation"
        assert len(gens) == len(sched.running) + sched.num_waiting, (
            f"{len(gens)} generations for {len(sched.running)} running and "
            f"{sched.num_waiting} waiting requests"
        )
        assert not self._events, "events left unpublished"
