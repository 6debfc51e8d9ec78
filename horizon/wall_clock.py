"""The serving loop on real time: a wall clock, arrivals replayed from a list, and the driver.

``run_wall_clock(serve(...), clock)`` runs ``horizon.serving_loop.serve`` for a backend that
does real work (the engine): a waitable the loop yields is a deadline, and the driver sleeps
until it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.serving_loop import Waits


class WallClock:
    """Seconds since ``start`` on ``time.perf_counter``; a waitable is a deadline."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start

    def now(self) -> float:
        return time.perf_counter() - self.start

    def sleep(self, seconds: float) -> float:
        return self.now() + seconds

    def until(self, t: float) -> float:
        return t


class ListArrivals:
    """Requests queued once the clock reaches their ``arrival_time`` (offline: all at 0)."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self._pending = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
        self._pending.reverse()  # pop() takes the earliest

    def admit(self, sched: Scheduler, now: float) -> None:
        pending = self._pending
        while pending and pending[-1].arrival_time <= now:
            sched.add(pending.pop())

    def due(self, now: float) -> bool:
        return bool(self._pending) and self._pending[-1].arrival_time <= now

    @property
    def exhausted(self) -> bool:
        return not self._pending

    def wait(self, now: float, end: float) -> float:
        return min(self._pending[-1].arrival_time, end) if self._pending else end


def run_wall_clock(
    loop: Waits, clock: WallClock, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Drive ``loop`` on real time: sleep until each deadline it yields; returns its result."""
    try:
        while True:
            deadline = loop.send(None)
            delay = deadline - clock.now()
            if delay > 0:
                sleep(delay)
    except StopIteration as stop:
        return stop.value
