"""The server's side of an engine in its own process (``executor.serve.engine_child``).

``EngineProcess`` is an ``EngineHandle``: ``submit`` and ``abort`` are one pipe message each
(request ids are assigned here, so no reply is awaited); a reader thread hands the steps'
events to ``publish`` (all that have come since its last wake-up, in two calls, the new
requests' first tokens before the rest: a reader that waits for the interpreter lock never
falls behind, and a first token does not wait for the running streams' text) and keeps the
engine's latest ``Stats``.
Admission control is counted here: what the engine last reported waiting, plus what was sent
since that report. With ``EngineSpec.text_in_server`` (the default) the text is made here, on
the reader thread, from the events' tokens (``ServerTexts``), and a stop string found here is
sent to the engine as a "stop".
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from executor.engine import EngineConfig
from executor.serve.engine_child import EngineInfo, EngineSpec, engine_main
from executor.serve.events import Event, first_tokens_first, unpack_events
from executor.serve.live_engine import EngineUnavailable, QueueFull, Stats
from executor.serve.params import GenerationParams
from executor.serve.request_text import ServerTexts
from horizon.metrics.records import RunRecords
from horizon.request import Request
from horizon.scheduler import never_fits_reason

# the reader thread's events and when their message was received (``time.perf_counter()``)
ReaderPublish = Callable[[list[Event], float], None]


class EngineProcess:
    """Args:
    spec: what the process builds (model, engine options, policy).
    publish: receives each step's events on this handle's reader thread, with the moment
        their message was received (``StreamHub.post``).
    max_waiting: ``submit`` raises QueueFull while this many requests wait.
    start_timeout_s: how long ``start`` waits for the model to load.
    """

    def __init__(
        self,
        spec: EngineSpec,
        publish: ReaderPublish,
        max_waiting: int = 1024,
        start_timeout_s: float = 1800.0,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting!r}")
        self.spec, self.max_waiting = spec, max_waiting
        self._publish, self._start_timeout = publish, start_timeout_s
        self.error: BaseException | None = None
        self.tokenizer: Any = None
        self.info: EngineInfo | None = None
        self.stats = Stats(num_blocks=1)
        self._lock = threading.Lock()  # the command pipe and the counts below
        self._ids = itertools.count()
        self._tokens = itertools.count()
        self._num_sent = 0
        self._reported = (0, 0)  # (num_waiting, num_received) of the latest stats
        self._replies: dict[int, Future] = {}
        self._closed: Future = Future()
        self._texts: ServerTexts | None = None
        self._down = False
        self._proc: mp.process.BaseProcess | None = None

    # -- the EngineHandle's facts ----------------------------------------------------------------
    @property
    def config(self) -> EngineConfig:
        return self._info().config

    @property
    def num_blocks(self) -> int:
        return self._info().num_blocks

    @property
    def vocab_size(self) -> int:
        return self._info().vocab_size

    @property
    def clock_start(self) -> float:
        return self._info().clock_start

    @property
    def alive(self) -> bool:
        return (
            self._proc is not None
            and self._proc.is_alive()
            and not self._down
            and not self._closed.done()
        )

    @property
    def num_waiting(self) -> int:
        with self._lock:
            waiting, received = self._reported
            return waiting + self._num_sent - received

    def _info(self) -> EngineInfo:
        assert self.info is not None, "the engine process has not started"
        return self.info

    # -- start and stop --------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the process and wait until its model is loaded.

        Raises:
            RuntimeError: the process failed to build its engine (its error), or took longer
                than ``start_timeout_s``.
        """
        assert self._proc is None, "started twice"
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        cmd_recv, self._commands = ctx.Pipe(duplex=False)
        self._events, out_send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=engine_main, args=(self.spec, cmd_recv, out_send), name="horizon-engine"
        )
        self._proc.daemon = True
        self._proc.start()
        cmd_recv.close()
        out_send.close()
        if not self._events.poll(self._start_timeout):
            self._proc.kill()
            raise RuntimeError(f"the engine process did not start in {self._start_timeout:.0f} s")
        first = self._recv()
        if first is None or first[0] != "ready":
            self._proc.join(5)
            why = first[1] if first else f"exit code {self._proc.exitcode}"
            raise RuntimeError(f"the engine process failed: {why}")
        _, self.info, self.tokenizer = first
        self.stats = Stats(num_blocks=self.info.num_blocks)
        if self.spec.text_in_server:
            self._texts = ServerTexts(self.tokenizer)
        threading.Thread(target=self._read, name="horizon-engine-events", daemon=True).start()

    def warmup(self) -> None:
        self._call("warmup", None)

    def close(self, timeout: float = 30.0) -> None:
        """Abort what is held, end the engine's loop and its process (records come back)."""
        if self._proc is None or self._closed.done():
            return
        try:
            self._send(("close",))
            self._closed.result(timeout)
        except (EngineUnavailable, TimeoutError):  # gone, or stuck: no records come back
            self._proc.kill()
            self._settle(None)
        self._proc.join(timeout)

    def records(self) -> RunRecords:
        """The run's records (after ``close``)."""
        assert self._closed.done(), "records are built once the run is closed"
        records = self._closed.result()
        if records is None:
            raise RuntimeError(f"the engine process returned no records ({self.error!r})")
        return records

    # -- requests --------------------------------------------------------------------------------
    def never_fits(self, num_prompt_tokens: int, max_tokens: int) -> str:
        cfg = self.config
        probe = Request(0, 0.0, num_prompt_tokens, max_tokens, max_tokens)
        return never_fits_reason(probe, cfg.block_size, self.num_blocks, cfg.max_model_len)

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        request_id: int | None = None,
        arrival: float | None = None,
    ) -> int:
        """Send a request; its id (assigned here unless given). ``arrival`` as
        ``LiveEngine.submit`` (``perf_counter`` is one clock for the machine's processes)."""
        if not self.alive:
            raise EngineUnavailable(self._why_down())
        if self.num_waiting >= self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are waiting")
        with self._lock:
            rid = next(self._ids) if request_id is None else request_id
            self._num_sent += 1
            if self._texts is not None:
                self._texts.add(rid, params)
            self._commands.send(("submit", rid, tuple(prompt_ids), params, arrival))
        return rid

    def abort(self, request_id: int) -> None:
        if self.alive:
            self._send(("abort", request_id))

    def check_integrity(self, timeout: float = 30.0) -> None:
        self._call("check_integrity", timeout)

    def wait_idle(self, timeout: float = 30.0) -> None:
        self._call("wait_idle", timeout + 5.0)

    # -- the pipes -------------------------------------------------------------------------------
    def _send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            try:
                self._commands.send(message)
            except (BrokenPipeError, OSError) as e:
                raise EngineUnavailable(f"the engine process is gone: {e}") from None

    def _call(self, name: str, timeout: float | None) -> None:
        fut: Future = Future()
        with self._lock:
            token = next(self._tokens)
            self._replies[token] = fut
        self._send(("call", token, name))
        error = fut.result(timeout)
        if error:
            raise RuntimeError(f"{name} in the engine process: {error}")

    def _recv(self) -> tuple[Any, ...] | None:
        try:
            return self._events.recv()
        except (EOFError, OSError):
            return None

    def _read(self) -> None:
        """The reader thread: until "closed" (or the process is gone). It takes every message
        the pipe holds at each wake-up and publishes their events in two calls, the requests'
        first tokens (their text made) before the rest (``first_tokens_first``)."""
        while (message := self._recv()) is not None:
            batch = [message]
            while self._events.poll(0) and (message := self._recv()) is not None:
                batch.append(message)
            received = time.perf_counter()
            events = [e for m in batch if m[0] in ("step", "events") for e in m[1]]
            for part in first_tokens_first(unpack_events(events)):
                if part:
                    self._publish(self._with_text(part), received)
            for m in batch:
                if self._take(m):
                    return
        self._down = True
        self.error = self.error or RuntimeError("the engine process ended")
        self._settle(None)
        for fut in self._replies.values():
            fut.set_result("the engine process ended")

    def _with_text(self, events: list[Event]) -> list[Event]:
        """The events with their text (made here with ``text_in_server``); the requests a stop
        string ended here are stopped in the engine."""
        if self._texts is None:
            return events
        events, stops = self._texts.apply(events)
        for rid in stops:
            with contextlib.suppress(EngineUnavailable):  # gone: its requests end anyway
                self._send(("stop", rid))
        return events

    def _take(self, message: tuple[Any, ...]) -> bool:
        """Apply one message but its events; True for the last one ("closed")."""
        kind = message[0]
        if kind == "step":
            _, _, self.stats, waiting, received = message
            with self._lock:
                self._reported = (waiting, received)
        elif kind == "reply":
            self._replies.pop(message[1]).set_result(message[2])
        elif kind == "down":
            self._down, self.error = True, RuntimeError(message[1])
        elif kind == "closed":
            if message[2]:
                self.error = RuntimeError(message[2])
            self._settle(message[1])
            return True
        return False

    def _settle(self, records: RunRecords | None) -> None:
        """The run is over (records, or None): once, whichever thread sees it first."""
        with contextlib.suppress(InvalidStateError):
            self._closed.set_result(records)

    def _why_down(self) -> str:
        if self._proc is None:
            return "the engine is not started"
        return "the engine is closed" if self.error is None else f"the engine stopped: {self.error}"
