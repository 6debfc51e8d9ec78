"""The asyncio side of the engine's events: one queue per request.

The engine's side calls ``StreamHub.post(events)`` once per step (or per wake-up of an engine
process's reader thread); that schedules ``_deliver`` on the event loop
(``call_soon_threadsafe``), which puts each event in its request's queue and observes the
serving metrics. A handler ``open``s its stream right after ``submit`` (no await between, so
no event can come first) and iterates it. A traced stream (``open(..., handler=t)``) stamps
its first token's way out (``ttft_trace.FirstToken``) and lands in the hub's ``trace`` once
that token's chunk is written (``wrote``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from executor.serve.events import Event
from executor.serve.metrics import ServingMetrics
from executor.serve.ttft_trace import FirstToken, TtftTrace


class RequestStream:
    """A request's events in order, ending with the one that has a finish reason.

    ``first``: its first token's moments (None: not traced), stamped by the hub up to
    ``delivered`` and by the response through ``wrote``."""

    def __init__(
        self,
        request_id: int,
        num_prompt_tokens: int,
        arrival: float,
        first: FirstToken | None = None,
        trace: TtftTrace | None = None,
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = arrival
        self.last: float | None = None  # time of the latest token
        self.done = False
        self.first = first
        self._trace = trace
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self.done:
            event = await self._queue.get()
            self.done = event.finish_reason is not None
            yield event

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The same events, as many at a time as have come (at least one): a stream that
        has fallen behind the engine catches up in one write."""
        queue = self._queue
        while not self.done:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            self.done = batch[-1].finish_reason is not None
            yield batch

    def wrote(self, now: float, text: bool) -> bool:
        """The response handed a chunk with tokens (``text``: and some text) to the
        transport at ``now``; whether a later write still has a stamp to make."""
        first = self.first
        assert first is not None, "an untraced stream"
        if first.written != first.written:  # NaN: the first token's chunk
            first.written = now
            if self._trace is not None:
                self._trace.add(first)
        if text:
            first.text_written = now
            return False
        return True


class StreamHub:
    """Streams by request id; ``bind`` it to the running loop before the first ``post``.
    ``trace``: the first tokens' moments of the traced streams (``ttft_trace``)."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics
        self.trace = TtftTrace()
        self._streams: dict[int, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def open(
        self,
        request_id: int,
        num_prompt_tokens: int,
        arrival: float,
        handler: float | None = None,
        response_id: str = "",
    ) -> RequestStream:
        """On the loop: the stream of a request just submitted; traced if ``handler`` (when
        its endpoint started, ``perf_counter``) is given, under its ``response_id``."""
        first = None
        if handler is not None:
            first = FirstToken(request_id, response_id, handler, arrival)
        stream = RequestStream(request_id, num_prompt_tokens, arrival, first, self.trace)
        self._streams[request_id] = stream
        self.metrics.arrived(num_prompt_tokens)
        return stream

    @property
    def num_open(self) -> int:
        return len(self._streams)

    def post(self, events: list[Event], received: float | None = None) -> None:
        """Engine's side (not the loop's thread): hand events to the loop; ``received``:
        when their message left the engine's pipe (None: now)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            posted = time.perf_counter()
            loop.call_soon_threadsafe(
                self._deliver, events, posted if received is None else received, posted
            )

    def _deliver(self, events: list[Event], received: float, posted: float) -> None:
        streams, metrics = self._streams, self.metrics
        for e in events:
            s = streams.get(e.request_id)
            if s is None:
                continue
            metrics.observe(e, s.arrival, s.last)
            if e.token_ids:
                if s.last is None and s.first is not None:
                    first = s.first
                    first.received, first.posted = received, posted
                    first.delivered = time.perf_counter()
                s.last = e.time
            s._queue.put_nowait(e)
            if e.finish_reason is not None:
                del streams[e.request_id]
