"""Stop strings over streamed text: cut the text before the first stop string, and hold back
a tail that may be the start of one until the next text tells."""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    """``feed(text, active) -> (text to emit, stopped)``; ``flush() -> held text``.

    While inactive (before ``min_tokens``) text passes through unchecked. Once a stop string
    is found, the text from its start on is dropped and ``stopped`` is True.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._longest = max(map(len, self.stops), default=0)
        self._held = ""

    def feed(self, text: str, active: bool = True) -> tuple[str, bool]:
        buf = self._held + text
        if not active:
            self._held = ""
            return buf, False
        first = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if first >= 0:
            self._held = ""
            return buf[:first], True
        keep = self._partial_tail(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest tail of ``buf`` that a stop string starts with."""
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
