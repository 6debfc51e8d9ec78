"""KV-cache traces that publish shared-prefix block ids instead of text (Mooncake's format).

One JSON object per line (plain or gzipped, detected by content)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

``timestamp`` is in milliseconds; ``hash_ids[j]`` names the content of prompt tokens
``j * block_size .. (j + 1) * block_size - 1`` (block size 512 in Mooncake's traces), chained:
two requests whose ``hash_ids`` agree on their first ``s`` entries share their first
``s * block_size`` prompt tokens.

Prompts are synthesised to keep exactly that sharing: block ``h`` is ``block_size`` random ids
drawn from a generator seeded with ``(seed, h)``; a prompt is its blocks' concatenation cut to
``input_length``, padded (when ``input_length`` exceeds ``len(hash_ids) * block_size``) with ids
seeded by the request's line number, so padding is never shared. Horizon's own prefix cache
(``chained_block_hashes``, any block size dividing ``block_size``) then finds equal hashes
exactly on the shared prefix.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from horizon.request import Request
from horizon.workload.field_checks import is_int, is_number

_GZIP_MAGIC = b"\x1f\x8b"
_BLOCK_STREAM = 0  # seed-sequence tag of a block's ids
_PAD_STREAM = 1  # seed-sequence tag of a request's padding


def load_hash_trace(
    path: str | os.PathLike[str],
    block_size: int = 512,
    max_output_tokens: int = 2048,
    limit: int | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    vocab_size: int = 151_000,
) -> tuple[Request, ...]:
    """Requests of a hash-id trace, numbered in arrival order.

    Args:
        path: a ``.jsonl`` file, or the same gzipped (``.jsonl.gz``); blank lines are skipped.
        block_size: tokens per hash id (512 for Mooncake).
        max_output_tokens: every request's output limit; ``output_length`` is clamped to
            ``1 .. max_output_tokens``.
        limit: read only the first ``limit`` records (None = all).
        time_scale: 2 replays the trace twice as fast.
        seed: fixes the synthesised token ids (same seed and file, same prompts).
        vocab_size: token ids are drawn from ``0 .. vocab_size - 1``.

    Returns:
        Requests sorted by timestamp (stable: file order breaks ties), ``request_id == index``,
        ``arrival_time = (timestamp - first timestamp) / 1000 / time_scale`` seconds, with
        ``prompt_token_ids`` (see the module docstring) and no ``output_token_ids``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a bad argument (named), an empty trace, or a malformed line: not a JSON
            object, or a missing or invalid ``timestamp`` (finite number), ``input_length``
            (int >= 1), ``output_length`` (int >= 0) or ``hash_ids`` (list of ints >= 0); the
            message names the file, the line number and the field.
    """
    _check_args(block_size, max_output_tokens, limit, time_scale, seed, vocab_size)
    path = Path(path)
    records = list(_records(path, limit))
    if not records:
        raise ValueError(f"{path}: empty trace (no records)")
    records.sort(key=lambda r: r[1]["timestamp"])  # stable
    first = records[0][1]["timestamp"]
    blocks = _BlockIds(seed, block_size, vocab_size)
    return tuple(
        Request(
            request_id=i,
            arrival_time=(rec["timestamp"] - first) / 1000.0 / time_scale,
            num_prompt_tokens=rec["input_length"],
            max_output_tokens=max_output_tokens,
            true_output_tokens=min(max(rec["output_length"], 1), max_output_tokens),
            prompt_token_ids=blocks.prompt(rec["hash_ids"], rec["input_length"], line),
        )
        for i, (line, rec) in enumerate(records)
    )


class _BlockIds:
    """Token ids of each hash id (memoised for one load) and of request-unique padding."""

    def __init__(self, seed: int, block_size: int, vocab_size: int) -> None:
        self.seed = seed
        self.block_size = block_size
        self.vocab_size = vocab_size
        self._blocks: dict[int, np.ndarray] = {}

    def _draw(self, tag: int, key: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, tag, key])
        return rng.integers(0, self.vocab_size, size=n, dtype=np.int64)

    def block(self, h: int) -> np.ndarray:
        ids = self._blocks.get(h)
        if ids is None:
            ids = self._blocks[h] = self._draw(_BLOCK_STREAM, h, self.block_size)
        return ids

    def prompt(self, hash_ids: list[int], length: int, line: int) -> tuple[int, ...]:
        need = -(-length // self.block_size)  # blocks that reach into the prompt
        parts = [self.block(h) for h in hash_ids[:need]]
        covered = len(parts) * self.block_size
        if covered < length:
            parts.append(self._draw(_PAD_STREAM, line, length - covered))
        return tuple(np.concatenate(parts)[:length].tolist())


def _records(path: Path, limit: int | None) -> Iterator[tuple[int, dict]]:
    """``(line number, checked record)`` of each non-blank line, up to ``limit`` records."""
    count = 0
    with _open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if limit is not None and count == limit:
                return
            yield line_no, _parse(path, line_no, line)
            count += 1


def _parse(path: Path, line_no: int, line: str) -> dict:
    where = f"{path}, line {line_no}"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in rec:
            raise ValueError(f"{where}: missing field {name!r}")
    if not is_number(rec["timestamp"]):
        raise ValueError(f"{where}: timestamp must be a finite number, got {rec['timestamp']!r}")
    for name, minimum in (("input_length", 1), ("output_length", 0)):
        v = rec[name]
        if not is_int(v) or v < minimum:
            raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {v!r}")
    ids = rec["hash_ids"]
    if not isinstance(ids, list) or not all(is_int(h) and h >= 0 for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of ints >= 0, got {ids!r:.80}")
    return rec


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == _GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _check_args(
    block_size: int,
    max_output_tokens: int,
    limit: int | None,
    time_scale: float,
    seed: int,
    vocab_size: int,
) -> None:
    for name, v, minimum in (
        ("block_size", block_size, 1),
        ("max_output_tokens", max_output_tokens, 1),
        ("seed", seed, 0),
        ("vocab_size", vocab_size, 2),
    ):
        if not is_int(v) or v < minimum:
            raise ValueError(f"load_hash_trace: {name} must be an int >= {minimum}, got {v!r}")
    if limit is not None and (not is_int(limit) or limit < 1):
        raise ValueError(f"load_hash_trace: limit must be an int >= 1 or None, got {limit!r}")
    if not is_number(time_scale) or time_scale <= 0:
        raise ValueError(
            f"load_hash_trace: time_scale must be a finite number > 0, got {time_scale!r}"
        )
