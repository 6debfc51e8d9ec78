"""Azure LLM inference traces (2023): arrival times and token counts per request.

The CSVs (``AzureLLMInferenceTrace_conv.csv`` / ``_code.csv``, from Azure/AzurePublicDataset) have
a header ``TIMESTAMP,ContextTokens,GeneratedTokens``, CRLF line endings and timestamps such as
``2023-11-16 18:15:46.6805900`` (7 fractional digits, more than ``datetime`` parses). They may be
gzipped (detected by content, not by name).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
)
_COUNT = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, eq=False)
class AzureTrace:
    """One trace's rows, in file order (read-only arrays of equal length).

    ``times``: float64 seconds since the first row (non-decreasing, ``times[0] == 0``);
    ``context_tokens`` / ``generated_tokens``: int64 counts >= 0.
    """

    times: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.times)


def load_azure_trace(path: str | os.PathLike[str]) -> AzureTrace:
    """Read an Azure 2023 LLM inference trace CSV (plain or gzipped).

    Columns are found by header name (others are ignored). Rows must have non-decreasing
    timestamps.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a missing column, an empty trace, or a malformed row (unparsable timestamp,
            a count that is not a non-negative integer, such as ``-3``, ``1.5`` or ``NaN``, a
            missing field, a decreasing timestamp); the message names the file, the line and
            the field.
    """
    path = Path(path)
    ns: list[int] = []
    ctx: list[int] = []
    gen: list[int] = []
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file (expected header {','.join(_COLUMNS)})")
        header = [h.strip() for h in header]
        for name in _COLUMNS:
            if name not in header:
                raise ValueError(f"{path}, line 1: missing column {name!r} in header {header}")
        idx = [header.index(name) for name in _COLUMNS]
        i_ts, i_ctx, i_gen = idx
        for row in reader:
            line = reader.line_num
            if not row:
                continue  # blank line (e.g. a trailing newline)
            missing = [name for name, i in zip(_COLUMNS, idx, strict=True) if i >= len(row)]
            if missing:
                raise ValueError(f"{path}, line {line}: field {missing[0]!r} is missing ({row})")
            t = _parse_timestamp(row[i_ts], path, line)
            if ns and t < ns[-1]:
                raise ValueError(f"{path}, line {line}: field 'TIMESTAMP' decreases ({row[i_ts]})")
            ns.append(t)
            ctx.append(_parse_count(row[i_ctx], "ContextTokens", path, line))
            gen.append(_parse_count(row[i_gen], "GeneratedTokens", path, line))
    if not ns:
        raise ValueError(f"{path}: no rows")
    times = (np.asarray(ns, dtype=np.int64) - ns[0]).astype(np.float64) / 1e9
    arrays = (times, np.asarray(ctx, dtype=np.int64), np.asarray(gen, dtype=np.int64))
    for a in arrays:
        a.flags.writeable = False
    return AzureTrace(*arrays, source=str(path.resolve()))


@contextmanager
def _open_text(path: Path) -> Iterator[io.TextIOWrapper]:
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if gzipped else path.open("rb") as raw:
        # newline="" lets csv handle CRLF itself
        yield io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _parse_timestamp(s: str, path: Path, line: int) -> int:
    """Nanoseconds since 1970 (naive wall clock; only differences matter)."""
    m = _TIMESTAMP.fullmatch(s.strip())
    try:
        if m is None:
            raise ValueError("expected YYYY-MM-DD HH:MM:SS[.fraction]")
        year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
        dt = datetime(year, month, day, hour, minute, second)
    except ValueError as e:
        raise ValueError(f"{path}, line {line}: field 'TIMESTAMP' is {s!r}: {e}") from None
    frac = m.group(7) or ""
    frac_ns = int(frac.ljust(9, "0")) if frac else 0
    return (dt - _EPOCH) // _ONE_SECOND * 1_000_000_000 + frac_ns


def _parse_count(s: str, field: str, path: Path, line: int) -> int:
    if _COUNT.fullmatch(s.strip()) is None:
        raise ValueError(f"{path}, line {line}: field {field!r} must be an integer >= 0, got {s!r}")
    return int(s)
