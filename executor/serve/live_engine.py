"""The engine serving live requests: one run on the wall clock that lasts until ``close``.

``LiveEngine`` owns an ``executor.engine.Engine`` (model, KV tensor, runner), a horizon
``Scheduler`` with any policy (by name, or ``package.module:Class``), a ``StreamBackend`` and an
``Inbox``, and runs ``horizon.serving_loop.serve`` on a background thread. Other threads call
``submit`` / ``abort`` / ``call``; each step's events go to ``publish`` (on the engine
thread: hand them on, e.g. with ``loop.call_soon_threadsafe``, and return).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from executor.engine import Engine, EngineConfig
from executor.model import CausalLM
from executor.sampling import SamplingParams
from executor.serve.generation import Generation
from executor.serve.inbox import Inbox, Submission
from executor.serve.params import GenerationParams
from executor.serve.protocol import TokenizerLike
from executor.serve.request_text import RequestText
from executor.serve.stream_backend import Publish, StreamBackend
from executor.serve.text_stream import make_detokenizer
from horizon.metrics.records import RunRecords
from horizon.policies.base import Policy
from horizon.policies.registry import make_policy
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.serving_loop import serve
from horizon.wall_clock import WallClock, run_wall_clock


class QueueFull(Exception):
    """As many requests wait as ``max_waiting`` allows."""


class EngineUnavailable(Exception):
    """The engine is closed, or stopped on an error."""


@dataclass(frozen=True)
class Stats:
    """The engine's state after its latest step or boundary (published by the engine
    thread, read by any)."""

    running: int = 0
    waiting: int = 0
    kv_used_blocks: int = 0
    num_blocks: int = 1
    num_preemptions: int = 0
    num_aborted: int = 0
    num_steps: int = 0

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.num_blocks


class LiveEngine:
    """Args:
    model: the decoder on its device.
    tokenizer: its tokenizer (end-of-sequence ids, detokenization).
    config: the engine's options; its stopping rule is forced to per-request ("eos",
        serial steps).
    policy: a horizon policy, or its name (``make_policy``).
    max_waiting: ``submit`` raises QueueFull while this many requests wait.
    publish: receives each step's events on the engine thread.
    idle_poll_s: longest sleep of an idle loop between looks at its inbox.
    on_stats: receives the new ``Stats`` and ``num_waiting`` on the engine thread after every
        step and boundary (an engine process sends them to its server).
    make_text: detokenize and apply stop strings here (True), or send tokens only and leave
        the text to the caller, who ends a request on a stop string with ``stop`` (an engine
        process's server: the text then costs the engine's loop nothing).
    """

    def __init__(
        self,
        model: CausalLM,
        tokenizer: TokenizerLike,
        config: EngineConfig,
        policy: Policy | str = "fcfs",
        max_waiting: int = 1024,
        publish: Publish | None = None,
        idle_poll_s: float = 1.0,
        on_stats: Callable[[Stats, int], None] | None = None,
        make_text: bool = True,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting!r}")
        self.engine = Engine(model, replace(config, stop="eos", async_steps=False), self._sampling)
        self.tokenizer = tokenizer
        self.max_waiting = max_waiting
        e = self.engine
        policy = make_policy(policy) if isinstance(policy, str) else policy
        self.sched = Scheduler(e.config.scheduler_config(e.num_blocks), policy)
        self.clock = WallClock()
        self.backend = StreamBackend(e.runner, self.sched, self.clock, publish or _drop)
        self.inbox = Inbox(
            self.backend, idle_poll_s, self._publish_stats, clock_start=self.clock.start
        )
        self.stats = Stats(num_blocks=e.num_blocks)
        self._on_stats = on_stats
        self._make_text = make_text
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._thread: threading.Thread | None = None

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_blocks(self) -> int:
        return self.engine.num_blocks

    @property
    def vocab_size(self) -> int:
        return self.engine.model.config.vocab_size

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet running (what ``max_waiting`` bounds)."""
        return self.inbox.num_waiting

    @property
    def clock_start(self) -> float:
        """``time.perf_counter()`` at the records' time zero."""
        return self.clock.start

    # -- any thread ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (once)."""
        assert self._thread is None, "started twice"
        self._thread = threading.Thread(target=self._run, name="horizon-engine", daemon=True)
        self._thread.start()

    def warmup(self) -> None:
        """Capture the engine's CUDA graphs on its own thread (after ``start``)."""
        self.call(self.engine.warmup).result()

    def never_fits(self, num_prompt_tokens: int, max_tokens: int) -> str:
        """Why such a request could never run here ("" if it could): the model length or the KV
        pool (``Scheduler.never_fits``)."""
        probe = Request(0, 0.0, num_prompt_tokens, max_tokens, max_tokens)
        return self.sched.never_fits(probe)

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        request_id: int | None = None,
        arrival: float | None = None,
    ) -> int:
        """Queue a request; returns its id (its events carry it): ``request_id`` if given
        (the caller keeps ids unique: an engine process takes its server's), else the next.
        ``arrival``: when the server received it (``time.perf_counter()``), the records'
        arrival (None: when the engine takes it in at its next step boundary).

        Raises:
            QueueFull: ``max_waiting`` requests wait already.
            EngineUnavailable: the engine is not running.
        """
        with self._lock:
            if not self.alive:
                raise EngineUnavailable(_why_down(self.error))
            if self.inbox.num_waiting >= self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are waiting")
            rid = self._next_id if request_id is None else request_id
            self._next_id = max(self._next_id, rid + 1)
        text = None
        if self._make_text:
            text = RequestText(params, make_detokenizer(self.tokenizer, params.skip_special_tokens))
        gen = Generation(rid, params, len(prompt_ids), self.tokenizer.eos_token_ids, text)
        try:
            self.inbox.put(Submission(gen, tuple(prompt_ids), arrival))
        except RuntimeError as e:
            raise EngineUnavailable(str(e)) from None
        return rid

    def abort(self, request_id: int) -> None:
        """Abort a request (its last event has finish reason "abort"); idempotent."""
        self.inbox.abort(request_id)

    def stop(self, request_id: int) -> None:
        """End a running request at its next token, finished with reason "stop" (its caller
        found a stop string in its text); a no-op for one that has ended."""
        gen = self.backend.generations.get(request_id)
        if gen is not None:
            gen.stop_requested = True

    def call(self, fn: Callable[[], Any]) -> Future:
        """``fn()`` on the engine thread at the next step boundary (at once if it is not
        running)."""
        if not self.alive:
            fut: Future = Future()
            fut.set_result(fn())
            return fut
        return self.inbox.call(fn)

    def check_integrity(self, timeout: float = 30.0) -> None:
        """Scheduler, runner and backend agree (run at a step boundary)."""
        self.call(self._check).result(timeout)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until nothing runs or waits (e.g. after a test's requests); TimeoutError else."""
        deadline = time.monotonic() + timeout
        while self.call(lambda: self.sched.has_work or self.inbox.num_waiting).result(timeout):
            if time.monotonic() > deadline:
                raise TimeoutError("the engine did not go idle")
            time.sleep(0.01)

    def close(self, timeout: float = 30.0) -> None:
        """Abort what is held, end the loop, join the thread."""
        self.inbox.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def records(self) -> RunRecords:
        """The run's records (after ``close``)."""
        assert not self.alive, "records are built once the run is closed"
        return self.sched.recorder.build()

    # -- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        sched, backend, clock = self.sched, self.backend, self.clock
        try:
            loop = serve(
                sched,
                backend,
                self.inbox,
                clock,
                check_on_idle=True,
                after_update=self._publish_stats,
            )
            run_wall_clock(loop, clock, sleep=self.inbox.sleep)
            sched.finish_run()
            self._check()
        except BaseException as e:
            self.error = e
            traceback.print_exc()
            backend.fail_all(_why_down(e))
            self.inbox.fail(_why_down(e))
        self._publish_stats()

    def _check(self) -> None:
        self.sched.check_integrity()
        self.backend.check_integrity()

    def _publish_stats(self) -> None:
        """After every step's update and boundary: the events since the last (a step's
        tokens once the records have their time), then the engine's state."""
        self.backend.flush()
        s = self.sched
        self.inbox.note_waiting(s.num_waiting)
        self.stats = Stats(
            len(s.running),
            s.num_waiting,
            s.pool.num_used,
            s.config.num_blocks,
            self.backend.num_preemptions,
            s.num_aborted,
            s.clock.step,
        )
        if self._on_stats is not None:
            self._on_stats(self.stats, self.inbox.num_waiting)

    def _sampling(self, r: Request) -> SamplingParams:
        """The request's sampling; with ``min_tokens`` (and not ``ignore_eos``) its
        end-of-sequence ids are suppressed until then, as vLLM does."""
        p = self.backend.generations[r.request_id].params
        if not p.min_tokens or p.ignore_eos:
            return p.sampling
        eos = tuple(self.tokenizer.eos_token_ids)
        return replace(p.sampling, min_tokens=p.min_tokens, suppress_ids=eos)


def _drop(events: list) -> None:
    pass


def _why_down(error: BaseException | None) -> str:
    return "the engine is closed" if error is None else f"the engine stopped: {error!r}"
