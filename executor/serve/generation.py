"""One request's generation on the engine thread: its stopping rule and, where the engine
makes the text, its text (``RequestText``)."""

from __future__ import annotations

from collections.abc import Collection

from executor.serve.events import Event
from executor.serve.params import GenerationParams
from executor.serve.request_text import RequestText


class Generation:
    """Turns each token of request ``request_id`` into an ``Event``, deciding when it stops:
    end-of-sequence (unless ``ignore_eos``; not before ``min_tokens``), ``max_tokens``, a stop
    string (not before ``min_tokens``; only with ``text``), or ``stop_requested``.

    ``text``: the request's ``RequestText`` when the engine makes the text; None when its
    server does (an engine process): events then carry tokens only, and the server, finding
    a stop string, sets ``stop_requested`` (any thread may: the engine thread reads it at the
    request's next token, which ends it with reason "stop").
    """

    __slots__ = ("request_id", "params", "num_prompt", "_eos", "_text", "n", "stop_requested")

    def __init__(
        self,
        request_id: int,
        params: GenerationParams,
        num_prompt: int,
        eos_token_ids: Collection[int],
        text: RequestText | None,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.num_prompt = num_prompt
        self._eos = frozenset(eos_token_ids)
        self._text = text
        self.n = 0  # tokens generated
        self.stop_requested = False

    def push(self, token: int, now: float) -> Event:
        """The event of one generated token; its ``finish_reason`` is set if it is the last."""
        self.n += 1
        p, n = self.params, self.n
        finish = None
        eos = not p.ignore_eos and token in self._eos and n >= p.min_tokens
        if eos or self.stop_requested:
            finish = "stop"
        elif n >= p.max_tokens:
            finish = "length"
        if self._text is None:
            return Event(self.request_id, "", (token,), n, finish, now)
        text, finish = self._text.feed(token, n, finish)
        return Event(self.request_id, text, (token,), n, finish, now)

    @property
    def tokens_left(self) -> int:
        """Tokens it may still generate (``max_tokens`` less those generated)."""
        return self.params.max_tokens - self.n

    def end(self, reason: str, now: float, error: str = "") -> Event:
        """The last event of a request stopped from outside (aborted, or an engine error)."""
        return Event(self.request_id, "", (), self.n, reason, now, error)
