"""Incremental detokenization: the text each new token adds, never half a character.

``IncrementalText`` works for any ``TokenizerLike`` (vLLM's offsets method): it decodes a short
window of recent ids twice, with and without the new ones, and emits the difference once it
does not end in U+FFFD (an incomplete UTF-8 sequence, or a byte-fallback token still waiting
for its continuation). Decoding a window rather than one token keeps the spaces and merges a
tokenizer makes depending on context. ``make_detokenizer`` prefers the project's
``executor.detokenizer.IncrementalDetokenizer`` where it exists.
"""

from __future__ import annotations

from executor.serve.protocol import DetokenizerLike, TokenizerLike

REPLACEMENT = "\ufffd"


class IncrementalText:
    """``push(token) -> delta``, ``flush() -> rest``; the deltas concatenate to the text of
    the whole sequence (for a byte-level tokenizer exactly ``decode(ids)``)."""

    def __init__(self, tokenizer: TokenizerLike, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0  # start of the decoding window
        self._read = 0  # ids before this are emitted

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        ids, decode = self._ids, self._tok.decode
        before = decode(ids[self._prefix : self._read], self._skip)
        now = decode(ids[self._prefix :], self._skip)
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(ids)
        return now[len(before) :]

    def flush(self) -> str:
        ids, decode = self._ids, self._tok.decode
        before = decode(ids[self._prefix : self._read], self._skip)
        now = decode(ids[self._prefix :], self._skip)
        self._prefix = self._read = len(ids)
        return now[len(before) :]


def make_detokenizer(tokenizer: TokenizerLike, skip_special: bool = True) -> DetokenizerLike:
    """``executor.detokenizer.IncrementalDetokenizer`` for the project's own ``Tokenizer``
    (where both modules exist), else ``IncrementalText``."""
    try:
        from executor.detokenizer import IncrementalDetokenizer
        from executor.tokenizer import Tokenizer
    except ImportError:
        return IncrementalText(tokenizer, skip_special)
    if isinstance(tokenizer, Tokenizer):
        return IncrementalDetokenizer(tokenizer, skip_special)
    return IncrementalText(tokenizer, skip_special)
