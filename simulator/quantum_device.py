"""One GPU time-sliced between contexts round robin, simulated as it runs: the ``quantum`` rule.

Processes that share a GPU without MPS get the device in turns: the driver runs one context's
kernels at a time and switches to the next context with work when the running one's time
slice (``quantum_s``) is used up or when it has nothing queued. This rule simulates that
directly, event by event, instead of pricing a step when it is submitted:

* each replica (owner) has a FIFO of submitted steps, each with its own time alone (its cost
  model's price); the device serves the owner at the head of its turn for at most
  ``quantum_s`` of work, then the next owner in round-robin order that has work;
* a context gives up its turn when a step of it ends (the step's token copy leaves the
  compute engine idle for that context, and a waiting context is switched in), or when its
  queue is empty;
* a switch between owners costs ``switch_s`` of device time;
* a step ends when it has had its own time on the device, so a step in flight is stretched by
  every neighbour that gets turns meanwhile, including neighbours that submit after it.

So a step's end is known only when it is over (``submit`` returns an event), unlike the
``fcfs`` and ``timeslice`` rules, which book an end at submission. Alone, a step takes
exactly its own time. Deterministic: the same submissions at the same times give the same
ends (ties between owners go round robin in the order owners first submitted).

While the same owners stay busy their turns repeat, so the device serves them up to the first
step end among them in one SimPy timeout (``rounds=True``, the default) instead of one per
slice, and cuts that at the end of the slice in progress when an owner outside them submits.
The ends are the slice-by-slice ones (``rounds=False``) but for rounding; a test holds the two
together.
"""

from __future__ import annotations

import math
from collections import deque

import simpy


class QuantumDevice:
    """The device's turns (see the module docstring); a SimPy process runs them.

    Contracts:
        * ``submit(owner, duration)`` queues a step and returns a SimPy event that succeeds
          with the step's end time (``>= now + duration``; ``duration <= 0``: when the owner's
          work queued before it ends, or at once, now, if none is).
        * An owner's steps run in submission order; the device is never idle while a step is
          queued, and never serves two owners at once.
        * ``busy_s`` (own time served) + ``switch_total_s`` <= the time the device had work.
    """

    def __init__(
        self,
        env: simpy.Environment,
        quantum_s: float,
        switch_s: float = 0.0,
        rounds: bool = True,
    ) -> None:
        if not (isinstance(quantum_s, (int, float)) and quantum_s > 0 and math.isfinite(quantum_s)):
            raise ValueError(f"QuantumDevice.quantum_s must be > 0 seconds, got {quantum_s!r}")
        if not (isinstance(switch_s, (int, float)) and 0 <= switch_s < math.inf):
            raise ValueError(f"QuantumDevice.switch_s must be >= 0, got {switch_s!r}")
        self.env = env
        self.quantum_s = float(quantum_s)
        self.switch_s = float(switch_s)
        self.rounds = rounds
        self._queues: dict[object, deque[list]] = {}  # owner -> [[left, own, event], ...]
        self._order: list[object] = []  # owners in order of first submission
        self._wake: simpy.Event | None = None
        self._members: set = set()  # the owners served now: their submissions wake no one
        self.busy_s = 0.0
        self.switch_total_s = 0.0
        env.process(self._run())

    def submit(self, owner: object, duration: float) -> simpy.Event:
        event = self.env.event()
        q = self._queues.get(owner)
        if duration <= 0:  # nothing to serve: it ends with the owner's work queued before it
            if q:
                q[-1][2].callbacks.append(lambda ev: event.succeed(ev.value))
                return event
            return event.succeed(self.env.now)
        if q is None:
            q = self._queues[owner] = deque()
            self._order.append(owner)
        q.append([float(duration), float(duration), event])
        wake = self._wake
        if wake is not None and owner not in self._members and not wake.triggered:
            self._wake = None
            wake.succeed()
        return event

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _next_owner(self, after: int) -> int | None:
        """Index in ``_order`` of the first owner after ``after`` (cyclically, itself last)
        with work; None if none has."""
        order, queues, n = self._order, self._queues, len(self._order)
        for i in range(1, n + 1):
            j = (after + i) % n
            if queues[order[j]]:
                return j
        return None

    def _run(self):  # noqa: ANN202 - a SimPy process
        env, current = self.env, -1
        while True:
            j = self._next_owner(current)
            if j is None:
                self._wake = env.event()
                yield self._wake
                continue
            if self.rounds:
                current = yield from self._to_next_end(self._busy_from(j), current)
                continue
            if current >= 0 and j != current and self.switch_s > 0:
                yield env.timeout(self.switch_s)
                self.switch_total_s += self.switch_s
            current = j
            yield from self._turn(self._queues[self._order[j]])

    def _busy_from(self, j: int) -> list[int]:
        """Indices in ``_order`` of the owners with work, in turn order from ``j``."""
        order, queues, n = self._order, self._queues, len(self._order)
        return [i for i in ((j + d) % n for d in range(n)) if queues[order[i]]]

    def _to_next_end(self, busy: list[int], current: int):  # noqa: ANN202
        """Serve ``busy``'s turns up to the first step end among them in one timeout, or to
        the first slice boundary after an owner outside them submits; returns the index of
        the last slice's owner (see the module docstring)."""
        env, q, k = self.env, self.quantum_s, len(busy)
        heads = [self._queues[self._order[i]][0] for i in busy]
        m = min(math.ceil((h[0] - 1e-12) / q) for h in heads) - 1  # whole rounds, no end
        p = next(p for p, h in enumerate(heads) if h[0] - m * q <= q + 1e-12)  # who ends
        last, r = m * k + p, min(q, heads[p][0] - m * q)  # the last slice, and its length
        first = self.switch_s if current >= 0 and busy[0] != current else 0.0
        sw = self.switch_s if k > 1 else 0.0  # alone, its slices follow each other
        t0 = env.now
        done = env.timeout(first + last * (q + sw) + r)
        self._members = {self._order[i] for i in busy}
        self._wake = wake = env.event()  # the end, or an owner outside them submits
        done.callbacks.append(lambda _: wake.triggered or wake.succeed())
        yield wake
        self._wake, self._members = None, set()
        if not done.processed:  # cut at the end of the slice in progress (its turn began before)
            i = max(0, 1 + math.floor((env.now - t0 - first - q) / (q + sw)))
            if i < last:
                yield env.timeout(t0 + first + i * (q + sw) + q - env.now)
                return self._served(busy, heads, i, first + i * sw)
            yield done
        return self._served(busy, heads, last, first + last * sw, r)

    def _served(self, busy, heads, i, switched, r=None) -> int:  # noqa: ANN001
        """Book slices 0..``i`` over ``busy`` (the last of length ``r`` and ending its step
        where given, else all full); returns the last slice's owner index."""
        q, k = self.quantum_s, len(busy)
        for p, h in enumerate(heads):
            h[0] -= q * ((i + 1) // k + (p < (i + 1) % k))
        self.busy_s += (i + 1) * q
        self.switch_total_s += switched
        if r is not None:  # the last slice was r, not q, and ended its owner's step
            queue = self._queues[self._order[busy[i % k]]]
            self.busy_s += r - q
            queue.popleft()[2].succeed(self.env.now)
        return busy[i % k]

    def _turn(self, queue: deque[list]):  # noqa: ANN202
        """Serve one owner's first step for one time slice, or to its end if sooner."""
        step = queue[0]
        run = min(self.quantum_s, step[0])
        yield self.env.timeout(run)
        self.busy_s += run
        step[0] -= run
        if step[0] <= 1e-12:
            queue.popleft()
            step[2].succeed(self.env.now)

    def check_integrity(self) -> None:
        assert set(self._order) == set(self._queues), "an owner without a queue"
        for q in self._queues.values():
            for left, own, event in q:
                assert 0 < left <= own + 1e-12, "a queued step's work out of range"
                assert not event.triggered, "a queued step already over"
        assert self.busy_s >= 0 and self.switch_total_s >= 0, "negative device time"
        assert self.busy_s + self.switch_total_s <= self.env.now + 1e-9, "device overbooked"
