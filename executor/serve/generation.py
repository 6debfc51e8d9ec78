"""One request's generation on the engine thread: its stopping rule and its text."""

from __future__ import annotations

from collections.abc import Collection

from executor.serve.events import Event
from executor.serve.params import GenerationParams
from executor.serve.protocol import DetokenizerLike
from executor.serve.stop_strings import StopStrings


class Generation:
    """Turns each token of request ``request_id`` into an ``Event``, deciding when it stops:
    end-of-sequence (unless ``ignore_eos``; not before ``min_tokens``), a stop string (not
    before ``min_tokens``), or ``max_tokens``."""

    __slots__ = ("request_id", "params", "num_prompt", "_eos", "_detok", "_stops", "n")

    def __init__(
        self,
        request_id: int,
        params: GenerationParams,
        num_prompt: int,
        eos_token_ids: Collection[int],
        detokenizer: DetokenizerLike,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.num_prompt = num_prompt
        self._eos = frozenset(eos_token_ids)
        self._detok = detokenizer
        self._stops = StopStrings(params.stop) if params.stop else None
        self.n = 0  # tokens generated

    def push(self, token: int, now: float) -> Event:
        """The event of one generated token; its ``finish_reason`` is set if it is the last."""
        self.n += 1
        p, n = self.params, self.n
        active = n >= p.min_tokens
        text = self._detok.push(token)
        finish = None
        if active and not p.ignore_eos and token in self._eos:
            finish = "stop"
        elif n >= p.max_tokens:
            finish = "length"
        if finish is not None:
            text += self._detok.flush()
        if self._stops is not None:
            text, hit = self._stops.feed(text, active)
            if hit:
                finish = "stop"
            elif finish is not None:
                text += self._stops.flush()
        return Event(self.request_id, text, (token,), n, finish, now)

    def end(self, reason: str, now: float, error: str = "") -> Event:
        """The last event of a request stopped from outside (aborted, or an engine error)."""
        return Event(self.request_id, "", (), self.n, reason, now, error)
