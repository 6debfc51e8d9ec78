"""A byte-level BPE tokenizer (GPT-2 family) built from a GGUF file's ``tokenizer.*`` metadata.

Encoding, as HF ``tokenizers`` does it for these vocabularies:

1. control and user-defined tokens (``tokenizer.ggml.token_type`` 3 and 4, e.g.
   ``<|im_start|>``) are cut out of the text whole, leftmost-longest, and become their ids;
2. the rest is split by the pre-tokenizer that ``tokenizer.ggml.pre`` names (``PRE_TOKENIZERS``:
   regexes applied in turn, each keeping its matches and the gaps between them as pieces);
3. each piece's UTF-8 bytes are spelled in GPT-2's byte alphabet (``byte_alphabet``) and merged
   by ``tokenizer.ggml.merges``, lowest rank first.

Decoding maps each token back to its bytes and decodes UTF-8 with replacement characters for
broken sequences (``IncrementalDetokenizer`` does the same token by token).

The regexes need the ``regex`` package (``\\p{L}``, ``\\p{N}``); the chat template is rendered by
``jinja2`` in a sandbox, as HF ``apply_chat_template`` does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import regex

_CONTROL, _USER_DEFINED = 3, 4
_CACHE_SIZE = 1 << 16  # merged pieces kept (a server sees unbounded text)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# ``tokenizer.ggml.pre`` -> the regexes of its pre-tokenizer, in order. "smollm" (and the
# StarCoder family it derives from) isolates every numeric character first, as HF's
# ``Digits(individual_digits=True)`` then ``ByteLevel`` in SmolLM2's tokenizer.json, and
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM, do.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "gpt2": (GPT2_SPLIT,),
    "smollm": (r"\p{N}", GPT2_SPLIT),
    "starcoder": (r"\p{N}", GPT2_SPLIT),
}


@functools.lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (``bytes_to_unicode``): printable Latin-1 bytes
    map to themselves, the other 68 to ``chr(256 + k)`` in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {b: chr(b) for b in keep}
    moved = [b for b in range(256) if b not in alphabet]
    alphabet.update({b: chr(256 + k) for k, b in enumerate(moved)})
    return alphabet


class Tokenizer:
    """Byte-level BPE over ``tokens`` (id -> token string in the byte alphabet).

    Args:
        tokens, merges, token_types: as ``tokenizer.ggml.{tokens,merges,token_type}``
            (merges as ``"left right"``, best first; types 3 control, 4 user-defined).
        pre: a key of ``PRE_TOKENIZERS``.
        bos_token_id, eos_token_ids, pad_token_id, unk_token_id: special ids (None: none).
        chat_template: a Jinja chat template, or None.
        add_bos, add_eos: what ``encode(add_special=True)`` adds.

    Raises ValueError for an unknown ``pre`` or mismatched lengths. Immutable after
    construction; ``encode`` memoises pieces it has merged.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        pre: str,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        if pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"unsupported tokenizer.ggml.pre {pre!r}; known: {', '.join(PRE_TOKENIZERS)}"
            )
        if len(token_types) != len(tokens):
            raise ValueError(f"{len(token_types)} token types for {len(tokens)} tokens")
        self.tokens = list(tokens)
        self.pre = pre
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.chat_template = chat_template
        self.add_bos, self.add_eos = add_bos, add_eos
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self._ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self._splits = [regex.compile(p) for p in PRE_TOKENIZERS[pre]]
        self.special_ids = frozenset(i for i, t in enumerate(token_types) if t == _CONTROL)
        whole = [
            self.tokens[i] for i, t in enumerate(token_types) if t in (_CONTROL, _USER_DEFINED)
        ]
        whole.sort(key=len, reverse=True)  # the first alternative that matches is the longest
        self._whole = re.compile("|".join(map(re.escape, whole))) if whole else None
        self._to_char = byte_alphabet()
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """From ``executor.gguf_weights.read_gguf_metadata``. Raises ValueError naming a
        missing field or an unsupported ``tokenizer.ggml.model`` (only gpt2 is)."""
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"unsupported tokenizer.ggml.model {model!r}; known: gpt2")

        def need(key: str) -> Any:
            if key not in meta:
                raise ValueError(f"GGUF metadata lacks field {key!r}")
            return meta[key]

        tokens = need("tokenizer.ggml.tokens")
        eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
        return cls(
            tokens,
            need("tokenizer.ggml.merges"),
            meta.get("tokenizer.ggml.token_type", [1] * len(tokens)),
            need("tokenizer.ggml.pre"),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[int(e) for e in eos if e is not None],
            pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
            unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
            chat_template=meta.get("tokenizer.chat_template"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        )

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """The tokenizer of the GGUF file at ``path``."""
        from executor.gguf_weights import open_gguf, read_gguf_metadata

        return cls.from_gguf_metadata(read_gguf_metadata(open_gguf(path)))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # -- encoding ---------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens written in it become their single ids.
        ``add_special``: also the BOS/EOS the file asks for (``add_bos``/``add_eos``)."""
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        start = 0
        for m in self._whole.finditer(text) if self._whole else ():
            self._encode_plain(text[start : m.start()], ids)
            ids.append(self._ids[m.group()])
            start = m.end()
        self._encode_plain(text[start:], ids)
        if add_special and self.add_eos and self.eos_token_ids:
            ids.append(self.eos_token_ids[0])
        return ids

    def _encode_plain(self, text: str, out: list[int]) -> None:
        pieces = [text] if text else []
        for split in self._splits:
            pieces = [p for piece in pieces for p in _split_isolated(split, piece)]
        for piece in pieces:
            ids = self._cache.get(piece)
            if ids is None:
                if len(self._cache) >= _CACHE_SIZE:
                    self._cache.clear()
                ids = self._cache[piece] = self._bpe(piece)
            out.extend(ids)

    def _bpe(self, piece: str) -> tuple[int, ...]:
        word = [self._to_char[b] for b in piece.encode("utf-8")]
        ranks = self._ranks
        while len(word) > 1:
            best = min(
                range(len(word) - 1), key=lambda i: ranks.get((word[i], word[i + 1]), 1 << 30)
            )
            pair = (word[best], word[best + 1])
            if pair not in ranks:
                break
            merged, i = [], 0
            while i < len(word):  # every occurrence of the pair, left to right
                if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return tuple(self._id_of(w) for w in word)

    def _id_of(self, token: str) -> int:
        i = self._ids.get(token)
        if i is None:
            if self.unk_token_id is None:
                raise ValueError(f"token {token!r} is not in the vocabulary and there is no unk")
            return self.unk_token_id
        return i

    # -- decoding ---------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (a special token: its text in UTF-8).
        Raises ValueError for an id outside the vocabulary."""
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(
                f"token id {token_id} is outside the vocabulary (0..{len(self.tokens) - 1})"
            )
        return _token_bytes(self, token_id)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """The text of ``ids`` (broken UTF-8 as U+FFFD); ``skip_special`` leaves control tokens
        out."""
        raw = b"".join(
            self.token_bytes(i) for i in ids if not (skip_special and i in self.special_ids)
        )
        return raw.decode("utf-8", errors="replace")

    # -- chat -------------------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of ``messages`` (``{"role", "content"}`` dicts) by the file's chat
        template, rendered as HF does (sandboxed Jinja, ``trim_blocks``, ``lstrip_blocks``).
        Raises ValueError when the file has no template."""
        if self.chat_template is None:
            raise ValueError("GGUF metadata lacks field 'tokenizer.chat_template'")
        special = {
            "bos_token": _text_or_empty(self, self.bos_token_id),
            "eos_token": _text_or_empty(
                self, self.eos_token_ids[0] if self.eos_token_ids else None
            ),
        }
        return _compiled_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **special
        )


def _split_isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """Matches of ``pattern`` and the non-empty gaps between them, in order."""
    out, start = [], 0
    for m in pattern.finditer(text):
        if m.start() > start:
            out.append(text[start : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def _token_bytes(tok: Tokenizer, token_id: int) -> bytes:
    text = tok.tokens[token_id]
    if token_id in tok.special_ids:
        return text.encode("utf-8")
    from_char = _from_char()
    try:
        return bytes(from_char[c] for c in text)
    except KeyError:  # not spelled in the byte alphabet (an added token): its own text
        return text.encode("utf-8")


@functools.lru_cache(maxsize=1)
def _from_char() -> dict[str, int]:
    return {c: b for b, c in byte_alphabet().items()}


def _text_or_empty(tok: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tok.tokens[token_id]


@functools.lru_cache(maxsize=8)
def _compiled_template(source: str):  # noqa: ANN202
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
