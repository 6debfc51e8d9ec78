"""Closed-loop sessions at run time: a conversation's next turn arrives only once its previous
reply finished, plus the session's think time (``horizon.workload.sessions`` builds them).

Clock-agnostic: the driver (a SimPy process, or the engine's driver on the wall clock) asks for
the first turns, reports each finished or rejected request with its time, and schedules what
comes back at its ``arrival_time``. A rejected turn ends its session: its later turns never
arrive (they are not part of the run's records).
"""

from __future__ import annotations

from collections.abc import Sequence

from horizon.request import Request


class SessionRelease:
    """Which turn arrives when. ``sessions``: objects with ``requests`` (turns in order) and
    ``think_times`` (one fewer), turn 0's ``arrival_time`` set to the session's start."""

    def __init__(self, sessions: Sequence) -> None:
        self._next: dict[int, tuple[Request, float]] = {}  # rid -> (next turn, think time)
        self._first: list[Request] = []
        self._last: set[int] = set()  # ids of sessions' final turns
        self.open = 0  # sessions with a turn still to arrive or to finish
        seen: set[int] = set()
        for s in sessions:
            turns, thinks = tuple(s.requests), tuple(s.think_times)
            if not turns:
                continue
            if len(thinks) != len(turns) - 1:
                raise ValueError(
                    f"session {getattr(s, 'session_id', '?')}: {len(thinks)} think times for "
                    f"{len(turns)} turns (need one fewer)"
                )
            for r in turns:
                if r.request_id in seen:
                    raise ValueError(f"request id {r.request_id} appears in two sessions' turns")
                seen.add(r.request_id)
            self._first.append(turns[0])
            for a, b, think in zip(turns, turns[1:], thinks):
                self._next[a.request_id] = (b, float(think))
            self._last.add(turns[-1].request_id)
            self.open += 1
        self._first.sort(key=lambda r: (r.arrival_time, r.request_id))

    def first_turns(self) -> list[Request]:
        """Every session's first turn, in arrival order."""
        return list(self._first)

    def finished(self, request: Request, t: float) -> Request | None:
        """``request`` finished at ``t``: its session's next turn (arrival set), or None."""
        nxt = self._next.pop(request.request_id, None)
        if nxt is None:
            if request.request_id in self._last:
                self._last.discard(request.request_id)
                self.open -= 1
            return None
        turn, think = nxt
        turn.arrival_time = t + think
        return turn

    def dropped(self, request: Request) -> None:
        """``request`` was rejected (or cut off): its session ends here."""
        cur = request.request_id
        while cur in self._next:
            cur = self._next.pop(cur)[0].request_id
        if cur in self._last:
            self._last.discard(cur)
            self.open -= 1

    @property
    def done(self) -> bool:
        """No turn will arrive any more and none is outstanding."""
        return self.open == 0
