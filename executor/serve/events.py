"""What the engine thread tells a request's handler, once per token (and at its end)."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True, slots=True)
class Event:
    """One request's news from one step.

    Attributes:
        request_id: the engine's id of the request.
        text: text that the step's token completes (may be ""; stop strings cut out).
        token_ids: the token(s) generated (empty for an abort or an error).
        num_output_tokens: tokens generated so far.
        finish_reason: None while it runs, else one of ``FINISH_REASONS``.
        time: ``time.perf_counter()`` when the step's tokens were read.
        error: what went wrong (finish reason "error").
    """

    request_id: int
    text: str
    token_ids: tuple[int, ...]
    num_output_tokens: int
    finish_reason: str | None
    time: float
    error: str = ""


def pack_events(events: list[Event]) -> list[tuple]:
    """Events as plain tuples in field order (pickled ~15x faster across processes)."""
    return [
        (e.request_id, e.text, e.token_ids, e.num_output_tokens, e.finish_reason, e.time, e.error)
        for e in events
    ]


def unpack_events(rows: list[tuple]) -> list[Event]:
    """``pack_events``'s inverse."""
    return [Event(*row) for row in rows]


def first_tokens_first(events: list[Event]) -> tuple[list[Event], list[Event]]:
    """``events`` in two lists, each in its order: the requests' first tokens, then the rest.
    Handed on in that order (made into text and posted to the loop first), a new request's
    first token does not wait behind the running streams' tokens of the same step; each
    request's own events keep their order (its first token is its first event with one)."""
    first = [e for e in events if e.num_output_tokens == 1 and e.token_ids]
    if not first:
        return first, events
    if len(first) == len(events):
        return first, []
    return first, [e for e in events if not (e.num_output_tokens == 1 and e.token_ids)]
