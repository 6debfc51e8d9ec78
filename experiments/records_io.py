"""RunRecords on disk: two Parquet tables and a small JSON file, in one directory.

    requests.parquet   one row per request, in record order; ``token_times`` is a list<double>
                       column (the CSR offsets are the lists' lengths, summed)
    steps.parquet      one row per engine step
    meta.json          num_kv_blocks, block_size, a format version, and every column's numpy dtype

``read_records(write_records(rec, d))`` gives arrays equal to the originals, dtypes included
(``digest()`` is unchanged). Output is deterministic: the same records give byte-identical files
(Parquet carries no timestamps; compression is pinned; pyarrow writes its own version into
``created_by``, so files are byte-identical for one pyarrow version).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from horizon.metrics.records import STEP_PLAN_COLUMNS, RunRecords

FORMAT = "horizon-run-records"
VERSION = 4
READABLE_VERSIONS = (2, 3, 4)  # v2 lacks STEP_PLAN_COLUMNS, v3 num_preempted: -1 (unknown)

REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "num_prompt_tokens",
    "true_output_tokens",
    "max_output_tokens",
    "num_output_tokens",
    "status",
    "ttft_slo",
    "itl_slo",
    "first_admit_time",
    "num_preemptions",
    "computed_tokens",
    "recomputed_tokens",
    "cached_tokens",
)
STEP_COLUMNS = (
    "step_start",
    "step_end",
    "prefill_tokens",
    "decode_tokens",
    "num_running",
    "num_waiting",
    "kv_used_blocks",
    "token_budget",
    *STEP_PLAN_COLUMNS,
)
_ARRAYS = (*REQUEST_COLUMNS, *STEP_COLUMNS, "token_times", "token_offsets")
_SCALARS = ("num_kv_blocks", "block_size")
# Every RunRecords field is stored exactly once; a new field must be added here too.
assert set(_ARRAYS + _SCALARS + ("reject_reason",)) == {f.name for f in fields(RunRecords)}

_PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 3, "use_dictionary": True}


class RecordPaths(NamedTuple):
    requests: Path
    steps: Path
    meta: Path


def _paths(directory: Path) -> RecordPaths:
    return RecordPaths(
        directory / "requests.parquet", directory / "steps.parquet", directory / "meta.json"
    )


def _token_lists(rec: RunRecords) -> pa.Array:
    offsets = np.asarray(rec.token_offsets, dtype=np.int64)
    values = pa.array(np.asarray(rec.token_times, dtype=np.float64), type=pa.float64())
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets), values)


def write_records(rec: RunRecords, directory: str | Path) -> RecordPaths:
    """Write ``rec`` into ``directory`` (created if needed), replacing earlier files there.

    Returns:
        The paths of requests.parquet, steps.parquet and meta.json.
    """
    paths = _paths(Path(directory))
    paths.requests.parent.mkdir(parents=True, exist_ok=True)
    req = {name: pa.array(np.asarray(getattr(rec, name))) for name in REQUEST_COLUMNS}
    req["reject_reason"] = pa.array([str(r) for r in rec.reject_reason], type=pa.string())
    req["token_times"] = _token_lists(rec)
    pq.write_table(pa.table(req), paths.requests, **_PARQUET_OPTIONS)
    steps = {name: pa.array(np.asarray(getattr(rec, name))) for name in STEP_COLUMNS}
    pq.write_table(pa.table(steps), paths.steps, **_PARQUET_OPTIONS)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "num_kv_blocks": int(rec.num_kv_blocks),
        "block_size": int(rec.block_size),
        "dtypes": {name: np.asarray(getattr(rec, name)).dtype.str for name in _ARRAYS},
    }
    paths.meta.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return paths


def _column(table: pa.Table, name: str, dtype: str) -> np.ndarray:
    col = table.column(name)
    arr = col.to_numpy() if col.num_chunks else np.empty(0)
    return np.ascontiguousarray(arr, dtype=np.dtype(dtype))


def read_records(directory: str | Path) -> RunRecords:
    """Read records written by ``write_records``.

    Raises:
        FileNotFoundError: when one of the three files is missing.
        ValueError: when meta.json is not of this format and version.
    """
    paths = _paths(Path(directory))
    meta = json.loads(paths.meta.read_text())
    if meta.get("format") != FORMAT or meta.get("version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{paths.meta}: expected format {FORMAT!r} version in {READABLE_VERSIONS}, "
            f"got {meta.get('format')!r} version {meta.get('version')!r}"
        )
    dtypes = meta["dtypes"]
    req = pq.read_table(paths.requests)
    steps = pq.read_table(paths.steps)
    cols = {name: _column(req, name, dtypes[name]) for name in REQUEST_COLUMNS}
    for name in STEP_COLUMNS:
        if name in dtypes:
            cols[name] = _column(steps, name, dtypes[name])
        else:  # an older file
            cols[name] = np.full(steps.num_rows, -1, dtype=np.int64)
    lists = req.column("token_times")
    lengths = pc.list_value_length(lists).to_numpy() if lists.num_chunks else np.empty(0)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths, dtype=np.int64)
    values = pc.list_flatten(lists).to_numpy() if lists.num_chunks else np.empty(0)
    return RunRecords(
        **cols,
        reject_reason=[str(r) for r in req.column("reject_reason").to_pylist()],
        token_times=np.ascontiguousarray(values, dtype=np.dtype(dtypes["token_times"])),
        token_offsets=offsets.astype(np.dtype(dtypes["token_offsets"])),
        num_kv_blocks=int(meta["num_kv_blocks"]),
        block_size=int(meta["block_size"]),
    )
