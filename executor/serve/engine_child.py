"""The engine's own process: it loads the model, runs a ``LiveEngine`` and talks to its server
over two pipes (``EngineProcess`` is the server's side).

The server's HTTP handling and the engine's steps then hold two interpreters' locks, not one:
a step's planning and read-back no longer wait for the event loop's Python.

Messages (tuples, pickled by ``multiprocessing.connection``):

server to engine (``commands``)::

    ("submit", request_id, prompt_ids, GenerationParams, arrival)
    ("abort", request_id)
    ("stop", request_id)               its server found a stop string: end it at its next token
    ("call", token, name)              name: "warmup", "check_integrity" or "wait_idle"
    ("close",)

engine to server (``outbox``)::

    ("ready", EngineInfo, tokenizer)   once, after the model is loaded; or ("failed", error)
    ("step", [tuple, ...], Stats, num_waiting, num_received)
                                       after each step and boundary: the events since the
                                       last one (``pack_events``), then the engine's state;
                                       with ``text_in_server`` the events carry tokens only
    ("events", [tuple, ...])           a request refused at submission
    ("reply", token, error)            error "" when the call succeeded
    ("down", error)                    the engine loop stopped on an error
    ("closed", RunRecords | None, error)   last
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from executor.engine import EngineConfig
from executor.serve.events import Event, pack_events
from executor.serve.live_engine import LiveEngine, Stats
from executor.serve.params import GenerationParams
from horizon.metrics.records import RunRecords
from horizon.policies.base import Policy

CALLS = ("warmup", "check_integrity", "wait_idle")


@dataclass(frozen=True)
class EngineSpec:
    """What the engine process builds: ``load_model(model, dtype, device, seed, tokenizer)``
    and a ``LiveEngine`` over it with ``config`` and ``policy`` (a name or
    ``package.module:Class``, something the process can import, or a fresh Policy object,
    which it gets a pickled copy of). ``text_in_server``: the engine sends tokens only and its
    server detokenizes and applies stop strings (``request_text.ServerTexts``): the engine's
    loop then spends nothing per token on text."""

    model: str
    config: EngineConfig
    dtype: str | None = None
    device: str = "cpu"
    seed: int = 0
    tokenizer: str = "byte"
    policy: str | Policy = "fcfs"
    torch_threads: int | None = None
    text_in_server: bool = True


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know of the engine it did not build."""

    config: EngineConfig
    num_blocks: int
    vocab_size: int
    clock_start: float


class _Outbox:
    """One pipe written by two threads (the engine's and the command reader's)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock, contextlib.suppress(BrokenPipeError, OSError):  # the server is gone
            self._conn.send(message)


def engine_main(spec: EngineSpec, commands: Connection, outbox_conn: Connection) -> None:
    """The process's entry point (``multiprocessing`` target). It ignores SIGINT: a
    terminal's Ctrl-C reaches the whole process group, and the server, shutting down, closes
    the engine (which then sends its records)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    outbox = _Outbox(outbox_conn)
    try:
        child = _Child(spec, outbox)
    except BaseException as e:  # told to the server, which raises it
        traceback.print_exc()
        outbox.send(("failed", f"{type(e).__name__}: {e}"))
        return
    live = child.live
    live.start()
    info = EngineInfo(live.config, live.num_blocks, live.vocab_size, live.clock_start)
    outbox.send(("ready", info, child.tokenizer))
    child.serve(commands)


class _Child:
    """The engine (built from ``spec``) and what it has been sent."""

    def __init__(self, spec: EngineSpec, outbox: _Outbox) -> None:
        import torch

        from executor.serve.model_loading import load_model

        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        model, self.tokenizer = load_model(
            spec.model, spec.dtype, spec.device, spec.seed, spec.tokenizer
        )
        self.outbox = outbox
        self.num_received = 0
        self._pending: list[Event] = []  # the engine thread's, until its next stats
        self.live = LiveEngine(
            model,
            self.tokenizer,
            spec.config,
            spec.policy,
            max_waiting=2**62,  # the server counts what waits (it sees submissions first)
            publish=self._publish,
            on_stats=self._on_stats,
            make_text=not spec.text_in_server,
        )

    def _publish(self, events: list[Event]) -> None:
        self._pending += events

    def _on_stats(self, stats: Stats, num_waiting: int) -> None:
        """One message per step (events and state together): the server's reader wakes once."""
        events, self._pending = pack_events(self._pending), []
        self.outbox.send(("step", events, stats, num_waiting, self.num_received))

    def serve(self, commands: Connection) -> None:
        """Read commands until "close" (or the server's end of the pipe closes)."""
        live, told_down = self.live, False
        while True:
            if not commands.poll(0.2):
                if not live.alive and not told_down and live.error is not None:
                    self.outbox.send(("down", repr(live.error)))
                    told_down = True
                continue
            try:
                message = commands.recv()
            except EOFError:
                message = ("close",)
            if message[0] == "close":
                break
            self._dispatch(message)
        live.close()
        records = None if live.alive else _records(live)
        self.outbox.send(("closed", records, "" if live.error is None else repr(live.error)))

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "submit":
            _, rid, prompt_ids, params, arrival = message
            self.num_received += 1
            self._submit(rid, prompt_ids, params, arrival)
        elif kind == "abort":
            self.live.abort(message[1])
        elif kind == "stop":
            self.live.stop(message[1])
        elif kind == "call":
            _, token, name = message
            try:
                if name not in CALLS:
                    raise ValueError(f"unknown call {name!r}")
                getattr(self.live, name)()
                self.outbox.send(("reply", token, ""))
            except Exception as e:  # the server raises it
                self.outbox.send(("reply", token, f"{type(e).__name__}: {e}"))
        else:
            raise ValueError(f"unknown command {kind!r}")

    def _submit(
        self, rid: int, prompt_ids: tuple[int, ...], params: GenerationParams, arrival: float
    ) -> None:
        try:
            self.live.submit(prompt_ids, params, request_id=rid, arrival=arrival)
        except Exception as e:  # the engine is down: the request ends at once
            event = Event(rid, "", (), 0, "error", time.perf_counter(), str(e))
            self.outbox.send(("events", pack_events([event])))


def _records(live: LiveEngine) -> RunRecords | None:
    try:
        return live.records()
    except Exception:  # a run that stopped on an error may have none to build
        traceback.print_exc()
        return None
