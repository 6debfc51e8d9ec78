"""A byte-level tokenizer: each UTF-8 byte one token (ids 0-255), a few special tokens after.

For random-weight models (forced-length studies: the text does not matter, the lengths do) and
for tests (a character of several bytes spans several tokens, so streaming must hold back half
characters). Special ids: ``<|endoftext|>`` 256, ``<|im_start|>`` 257, ``<|im_end|>`` 258; any
other id >= 256 reads as ``<|reserved_N|>``. The chat template is ChatML's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class ByteTokenizer:
    """``encode`` / ``decode`` / ``apply_chat_template`` over bytes (see the module docstring)."""

    eos_token_ids = (256, 258)
    vocab_size = 256 + len(SPECIALS)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Bytes of ``text``; special-token strings become their ids (``add_special`` adds
        nothing: this tokenizer has no BOS)."""
        ids: list[int] = []
        for part in _SPLIT.split(text):
            if part in SPECIALS:
                ids.append(256 + SPECIALS.index(part))
            elif part:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of ``ids``: byte runs as UTF-8 (invalid or incomplete bytes as U+FFFD),
        special ids dropped (or written out with ``skip_special=False``)."""
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            if run:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
            if not skip_special:
                out.append(SPECIALS[i - 256] if i - 256 < len(SPECIALS) else f"<|reserved_{i}|>")
        if run:
            out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return chatml(messages, add_generation_prompt)


def chatml(messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """ChatML's text of ``messages`` (Qwen's template, no default system prompt)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n" if add_generation_prompt else text
