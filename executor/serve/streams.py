"""The asyncio side of the engine's events: one queue per request.

The engine thread calls ``StreamHub.post(events)`` once per step; that schedules ``_deliver``
on the event loop (``call_soon_threadsafe``), which puts each event in its request's queue and
observes the serving metrics. A handler ``open``s its stream right after ``submit`` (no await
between, so no event can come first) and iterates it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from executor.serve.events import Event
from executor.serve.metrics import ServingMetrics


class RequestStream:
    """A request's events in order, ending with the one that has a finish reason."""

    def __init__(self, request_id: int, num_prompt_tokens: int, arrival: float) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = arrival
        self.last: float | None = None  # time of the latest token
        self.done = False
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


class StreamHub:
    """Streams by request id; ``bind`` it to the running loop before the first ``post``."""

    def __init__(self, metrics: ServingMetrics) -> None:
        self.metrics = metrics
        self._streams: dict[int, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def open(self, request_id: int, num_prompt_tokens: int, arrival: float) -> RequestStream:
        """On the loop: the stream of a request just submitted."""
        stream = RequestStream(request_id, num_prompt_tokens, arrival)
        self._streams[request_id] = stream
        self.metrics.arrived(num_prompt_tokens)
        return stream

    @property
    def num_open(self) -> int:
        return len(self._streams)

    def post(self, events: list[Event]) -> None:
        """Engine thread: hand one step's events to the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, events)

    def _deliver(self, events: list[Event]) -> None:
        streams, metrics = self._streams, self.metrics
        for e in events:
            s = streams.get(e.request_id)
            if s is None:
                continue
            metrics.observe(e, s.arrival, s.last)
            if e.token_ids:
                s.last = e.time
            s._queue.put_nowait(e)
            if e.finish_reason is not None:
                del streams[e.request_id]
