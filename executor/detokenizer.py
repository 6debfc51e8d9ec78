"""Streaming text of generated tokens: ``IncrementalDetokenizer``."""

from __future__ import annotations

import codecs

from executor.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns one request's tokens, pushed one at a time, into text as it completes.

    ``push`` returns only the text that the new token completes: bytes of a UTF-8 character
    split across tokens are held back until its last byte arrives (a byte-level BPE token may
    end mid-character). Broken sequences become U+FFFD, so that the concatenation of every
    ``push`` and the final ``flush`` equals ``tokenizer.decode(ids, skip_special)``.
    ``skip_special``: control tokens (e.g. ``<|im_end|>``) add no text.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by ``token_id`` (possibly empty). Raises ValueError for an id
        outside the vocabulary."""
        raw = self.tokenizer.token_bytes(token_id)
        if self.skip_special and token_id in self.tokenizer.special_ids:
            return ""
        return self._utf8.decode(raw)

    def flush(self) -> str:
        """The held-back bytes of an unfinished character, as U+FFFD (empty when none); the
        detokenizer is then ready for a new sequence."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
