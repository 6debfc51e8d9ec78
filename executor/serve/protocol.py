"""What the server needs of a tokenizer and an incremental detokenizer (structural types).

``executor.tokenizer.Tokenizer`` and ``executor.detokenizer.IncrementalDetokenizer`` satisfy
them, and so does the byte-level ``ByteTokenizer`` of ``executor.serve.byte_tokenizer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TokenizerLike(Protocol):
    @property
    def eos_token_ids(self) -> Sequence[int]:
        """Ids that end a sequence (a stop unless ``ignore_eos``)."""

    def encode(self, text: str, add_special: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of a chat (``{"role", "content"}`` messages)."""


class DetokenizerLike(Protocol):
    def push(self, token_id: int) -> str:
        """The text that ``token_id`` completes (possibly ""; never half a character)."""

    def flush(self) -> str:
        """What is left (an incomplete character as U+FFFD) at the end of the sequence."""
