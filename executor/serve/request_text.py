"""One request's text: incremental detokenization and its stop strings, wherever the text is
made (on the engine thread, or in the server's process for an engine in its own process)."""

from __future__ import annotations

from executor.serve.events import Event
from executor.serve.params import GenerationParams
from executor.serve.protocol import DetokenizerLike, TokenizerLike
from executor.serve.stop_strings import StopStrings
from executor.serve.text_stream import make_detokenizer


class RequestText:
    """``feed(token, n, finish) -> (text, finish)`` for the request's ``n``-th token, whose
    stopping rule said ``finish`` (None: it goes on): the text the token completes, flushed
    at the end; a stop string (checked from ``min_tokens`` on) cuts the text before it and
    makes the finish "stop". ``hit``: a stop string ended the request."""

    __slots__ = ("_detok", "_stops", "_min_tokens", "hit")

    def __init__(self, params: GenerationParams, detokenizer: DetokenizerLike) -> None:
        self._detok = detokenizer
        self._stops = StopStrings(params.stop) if params.stop else None
        self._min_tokens = params.min_tokens
        self.hit = False

    def feed(self, token: int, n: int, finish: str | None) -> tuple[str, str | None]:
        text = self._detok.push(token)
        if finish is not None:
            text += self._detok.flush()
        if self._stops is not None:
            text, self.hit = self._stops.feed(text, n >= self._min_tokens)
            if self.hit:
                finish = "stop"
            elif finish is not None:
                text += self._stops.flush()
        return text, finish

    def apply(self, event: Event) -> Event:
        """``event`` (tokens only, from an engine process) with its text; a stop string makes
        it the last ("stop"). An event without tokens (aborted, an error) passes unchanged."""
        if not event.token_ids:
            return event
        (token,) = event.token_ids
        text, finish = self.feed(token, event.num_output_tokens, event.finish_reason)
        return Event(
            event.request_id, text, event.token_ids, event.num_output_tokens, finish, event.time
        )


class ServerTexts:
    """The text of every request of an engine in its own process that sends tokens only
    (``LiveEngine(make_text=False)``), made on the server's side: ``add`` each request as it
    is sent, ``apply`` each batch of the engine's events in order. A stop string ends a
    request here at once; the engine, told by the ids ``apply`` returns (``LiveEngine.stop``),
    ends it at its next token, and that last event, like any before it, is dropped here."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, RequestText] = {}
        self._stopping: set[int] = set()  # ended here; the engine's last event not yet seen

    def __len__(self) -> int:
        """Requests with text still to come (or their engine's last event)."""
        return len(self._texts) + len(self._stopping)

    def add(self, request_id: int, params: GenerationParams) -> None:
        detok = make_detokenizer(self._tokenizer, params.skip_special_tokens)
        self._texts[request_id] = RequestText(params, detok)

    def apply(self, events: list[Event]) -> tuple[list[Event], list[int]]:
        """The events with their text (minus those of requests ended here), and the ids of the
        requests a stop string has just ended (to stop in the engine)."""
        out: list[Event] = []
        stops: list[int] = []
        texts, stopping = self._texts, self._stopping
        for e in events:
            rid = e.request_id
            if rid in stopping:
                if e.finish_reason is not None:
                    stopping.discard(rid)
                continue
            text = texts.get(rid)
            if text is not None:
                with_text = text.apply(e)
                if with_text.finish_reason is not None:
                    del texts[rid]
                    if e.finish_reason is None:
                        stopping.add(rid)
                        stops.append(rid)
                e = with_text
            out.append(e)
        return out, stops
