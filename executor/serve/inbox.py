"""Live arrivals for the serving loop: requests, aborts and calls posted from other threads,
taken in at each step boundary.

``Inbox`` is a ``horizon.serving_loop.Arrivals``: the loop calls ``admit`` between a step's
update and the next plan (a step boundary), where the scheduler is safe to change. When the
loop idles it sleeps in ``sleep``, which a post cuts short (``run_wall_clock``'s sleep).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from executor.serve.generation import Generation
from executor.serve.stream_backend import StreamBackend
from horizon.request import Request, RequestStatus
from horizon.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class Submission:
    """A request as posted: its generation (id and parameters), prompt ids, and when the
    server received it (``time.perf_counter()``; None: when the engine takes it in)."""

    generation: Generation
    prompt_ids: tuple[int, ...]
    arrival: float | None = None


class Inbox:
    """Thread-safe posts (``put``, ``abort``, ``call``, ``close``); engine-thread takes
    (``admit`` and the rest of the ``Arrivals`` protocol).

    ``num_waiting`` is requests posted and not yet taken plus the scheduler's waiting ones as
    of the last boundary or step (``note_waiting``): what admission control counts.
    """

    def __init__(
        self,
        backend: StreamBackend,
        idle_poll_s: float = 1.0,
        on_boundary: Callable[[], None] | None = None,
        clock_start: float = 0.0,
    ) -> None:
        self._backend = backend
        self._clock_start = clock_start  # perf_counter() at the scheduler's time zero
        self._on_boundary = on_boundary
        self._idle_poll = idle_poll_s
        self._cond = threading.Condition()
        self._new: list[Submission] = []
        self._aborts: list[int] = []
        self._calls: list[tuple[Callable[[], Any], Future]] = []
        self._closed = False
        self._sched_waiting = 0

    # -- any thread ------------------------------------------------------------------------------
    def put(self, submission: Submission) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._new.append(submission)
            self._cond.notify()

    def abort(self, request_id: int) -> None:
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the engine thread at the next step boundary; its Future."""
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def close(self) -> None:
        """Abort everything held and take nothing new: the loop then ends."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return len(self._new) + self._sched_waiting

    def note_waiting(self, n: int) -> None:
        with self._cond:
            self._sched_waiting = n

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less if anything is posted."""
        with self._cond:
            if not self._queued():
                self._cond.wait(seconds)

    # -- the engine thread: horizon.serving_loop.Arrivals ----------------------------------------
    def admit(self, sched: Scheduler, now: float) -> None:
        """Take in posted requests, then aborts, then calls."""
        with self._cond:
            if not self._queued():
                return
            new, self._new = self._new, []
            aborts, self._aborts = self._aborts, []
            calls, self._calls = self._calls, []
            for s in new:  # under the lock: num_waiting stays exact
                self._add(sched, s, now)
            if self._closed:
                aborts = list(self._backend.generations)
            for rid in aborts:
                sched.abort(rid)
            self._sched_waiting = sched.num_waiting
        self._backend.end(sched.take_aborted(), "abort", time.perf_counter())
        self._backend.flush()
        if self._on_boundary is not None:
            self._on_boundary()
        _run_calls(calls)

    def fail(self, error: str) -> None:
        """The loop has stopped: close, end posted requests with ``error``, fail the calls."""
        with self._cond:
            self._closed = True
            new, self._new = self._new, []
            calls, self._calls = self._calls, []
            self._aborts.clear()
        now = time.perf_counter()
        for s in new:
            self._backend.add(s.generation)
        self._backend.end([_stub(s) for s in new], "error", now, error)
        self._backend.flush()
        for _, fut in calls:
            fut.set_exception(RuntimeError(error))

    def _add(self, sched: Scheduler, s: Submission, now: float) -> None:
        gen, p = s.generation, s.generation.params
        n = len(s.prompt_ids)
        t = now if s.arrival is None else min(now, s.arrival - self._clock_start)
        r = Request(gen.request_id, t, n, p.max_tokens, p.max_tokens, prompt_token_ids=s.prompt_ids)
        self._backend.add(gen)
        sched.add(r)
        if r.status is RequestStatus.REJECTED:  # the server checks first: a misconfiguration
            self._backend.end([r], "error", time.perf_counter(), f"rejected: {sched.never_fits(r)}")

    def _queued(self) -> bool:
        return bool(self._new or self._aborts or self._calls) or (
            self._closed and bool(self._backend.generations)
        )

    def due(self, now: float) -> bool:
        with self._cond:
            return self._queued()

    @property
    def exhausted(self) -> bool:
        with self._cond:
            return self._closed and not self._queued()

    def wait(self, now: float, end: float) -> float:
        return min(now + self._idle_poll, end)


def _stub(s: Submission) -> Request:
    """A request object for a submission the scheduler never saw."""
    p = s.generation.params
    return Request(s.generation.request_id, 0.0, len(s.prompt_ids), p.max_tokens, p.max_tokens)


def _run_calls(calls: Sequence[tuple[Callable[[], Any], Future]]) -> None:
    for fn, fut in calls:
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to the caller
            fut.set_exception(e)
