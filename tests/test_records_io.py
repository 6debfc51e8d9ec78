from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_metrics_build import REJ, UNF, Req, Step, make_records, synthetic_records

from experiments.records_io import read_records, write_records


def _small():
    return make_records(
        [
            Req(0.0, (), UNF),
            Req(0.5, (1.0, 2.0, 4.0), ttft_slo=1.0, itl_slo=0.5, preemptions=2, recomputed=3),
            Req(0.6, (), REJ),
            Req(9.0, (10.0,)),
        ],
        [Step(0.0, 1.0, 4, 1, 1, 2, 3, 64), Step(1.0, 2.5, 0, 2, 2, 0, 4, 64)],
        num_kv_blocks=77,
        block_size=32,
    )


def _assert_same(a, b):
    assert a.digest() == b.digest()
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert type(x) is type(y) and x == y, f.name


@pytest.mark.parametrize(
    "build", [_small, lambda: make_records([]), lambda: synthetic_records(3000, 30)]
)
def test_round_trip_keeps_every_column_and_dtype(tmp_path, build):
    rec = build()
    paths = write_records(rec, tmp_path / "run")
    assert [p.name for p in paths] == ["requests.parquet", "steps.parquet", "meta.json"]
    back = read_records(tmp_path / "run")
    back.check()
    _assert_same(rec, back)


def test_file_layout(tmp_path):
    rec = _small()
    paths = write_records(rec, tmp_path)
    req = pq.read_table(paths.requests)
    assert req.num_rows == 4
    assert req.schema.field("token_times").type == pa.list_(pa.float64())
    assert req.column("token_times").to_pylist() == [[], [1.0, 2.0, 4.0], [], [10.0]]
    assert req.column("reject_reason").to_pylist() == ["", "", "too long", ""]
    assert pq.read_table(paths.steps).num_rows == 2
    meta = json.loads(paths.meta.read_text())
    assert (meta["num_kv_blocks"], meta["block_size"]) == (77, 32)
    assert meta["dtypes"]["status"] == "|i1"


def test_same_records_give_byte_identical_files(tmp_path):
    rec = synthetic_records(2000, 20, seed=5)
    a = write_records(rec, tmp_path / "a")
    b = write_records(rec, tmp_path / "b")
    for pa_, pb in zip(a, b, strict=True):
        assert pa_.read_bytes() == pb.read_bytes(), pa_.name


def test_byte_identical_across_processes(tmp_path):
    rec = _small()
    here = write_records(rec, tmp_path / "here")
    # A fresh interpreter (new hash seed, new allocator state) writes the same bytes.
    script = (
        "import sys; sys.path[:0] = ['tests', '.'];"
        "from test_records_io import _small; from experiments.records_io import write_records;"
        f"write_records(_small(), {str(tmp_path / 'there')!r})"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", script], cwd=root, check=True)
    for p in here:
        assert p.read_bytes() == (tmp_path / "there" / p.name).read_bytes(), p.name


def test_unknown_format_is_refused(tmp_path):
    paths = write_records(_small(), tmp_path)
    meta = json.loads(paths.meta.read_text())
    meta["version"] = 99
    paths.meta.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="version 99"):
        read_records(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "nowhere")


def test_reads_tables_split_into_many_row_groups(tmp_path):
    rec = synthetic_records(1000, 10, seed=2)
    paths = write_records(rec, tmp_path)
    for p in (paths.requests, paths.steps):
        pq.write_table(pq.read_table(p), p, row_group_size=97)
    assert pq.ParquetFile(paths.requests).num_row_groups > 1
    _assert_same(rec, read_records(tmp_path))


def test_npz_round_trip_keeps_every_field(tmp_path):
    from horizon.metrics.records import RunRecords

    rec = synthetic_records(300, 20, seed=5)
    rec.save_npz(str(tmp_path / "r.npz"))
    back = RunRecords.load_npz(str(tmp_path / "r.npz"))
    assert back.digest() == rec.digest()
