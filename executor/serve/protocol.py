"""What the server needs of a tokenizer, an incremental detokenizer and the engine
(structural types).

``executor.tokenizer.Tokenizer`` and ``executor.detokenizer.IncrementalDetokenizer`` satisfy
the first two, and so does the byte-level ``ByteTokenizer`` of ``executor.serve.byte_tokenizer``.
``LiveEngine`` (the engine on a thread of the server's process) and ``EngineProcess`` (the
engine in a process of its own) are ``EngineHandle``s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from executor.engine import EngineConfig
    from executor.serve.live_engine import Stats
    from executor.serve.params import GenerationParams
    from horizon.metrics.records import RunRecords


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


class EngineHandle(Protocol):
    """The engine as the HTTP API drives it. ``start`` then ``warmup`` before the first
    ``submit``; ``close`` once; ``records`` after it. Events go to the ``publish`` callable it
    was built with, one or two calls per step (first tokens first), on a thread that is not the
    event loop's.

    ``submit`` raises ``QueueFull`` while ``num_waiting >= max_waiting`` and
    ``EngineUnavailable`` when the engine is not running (``executor.serve.live_engine``).
    """

    config: EngineConfig
    error: BaseException | None

    @property
    def alive(self) -> bool: ...

    @property
    def stats(self) -> Stats:
        """As of the engine's latest step or boundary."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def clock_start(self) -> float:
        """``time.perf_counter()`` at the records' time zero (one clock for every process
        of the machine)."""

    def start(self) -> None: ...

    def warmup(self) -> None: ...

    def never_fits(self, num_prompt_tokens: int, max_tokens: int) -> str:
        """Why such a request could never run ("" if it could)."""

    def submit(
        self, prompt_ids: Sequence[int], params: GenerationParams, arrival: float | None = None
    ) -> int:
        """Queue a request; its id. ``arrival``: when the server received it
        (``time.perf_counter()``), which the records take as its arrival."""

    def abort(self, request_id: int) -> None: ...

    def check_integrity(self, timeout: float = 30.0) -> None: ...

    def wait_idle(self, timeout: float = 30.0) -> None: ...

    def close(self, timeout: float = 30.0) -> None: ...

    def records(self) -> RunRecords: ...
