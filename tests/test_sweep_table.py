"""A sweep's runs packed into runs.jsonl.gz: lossless, and read like the run directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.results import load_results
from experiments.sweep_table import TABLE, find_runs, pack, read_table, unpack
from experiments.table import write_table

REPO = Path(__file__).resolve().parents[1]
SWEEPS = [
    "docs/ablation/first_turn",
    "docs/ablation/multi_turn",
    "docs/ablation_roofline/first_turn",
    "docs/ablation_roofline/multi_turn",
]


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Six run directories of a committed sweep, written out, with records and odd bytes."""
    rows = read_table(REPO / SWEEPS[0] / TABLE)[::37]
    d = tmp_path / "sweep"
    for i, row in enumerate(rows):
        run = d / row["run"]
        (run / "records").mkdir(parents=True)
        (run / "records" / "meta.json").write_text("{}")  # not packed
        (run / "summary.json").write_text(row["summary.json"])
        config = row["config.yaml"] + ("# café\r\n" if i == 0 else "")  # kept byte for byte
        (run / "config.yaml").write_bytes(config.encode())
    return d


def _files(d: Path) -> dict[str, bytes]:
    names = ("summary.json", "config.yaml")
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.name in names}


def test_pack_then_unpack_gives_the_run_files_back_byte_for_byte(sweep, tmp_path):
    table = pack(sweep)
    assert table == sweep / TABLE and len(read_table(table)) == 6
    again = tmp_path / "again"
    again.mkdir()
    (again / TABLE).write_bytes(table.read_bytes())
    assert [p.relative_to(again) for p in unpack(again)] == [
        p.parent.relative_to(sweep) for p in sorted(sweep.rglob("summary.json"))
    ]
    assert _files(again) == _files(sweep) and len(_files(sweep)) == 12
    assert not list(again.rglob("records"))
    assert pack(again).read_bytes() == table.read_bytes()  # deterministic bytes
    with pytest.raises(FileExistsError, match="summary.json exists"):
        unpack(again)


def test_packed_runs_read_as_their_directories(sweep, tmp_path):
    from_dirs = load_results([sweep])
    write_table(from_dirs, tmp_path / "dirs")
    pack(sweep)
    shutil.rmtree(sweep / "runs")
    assert [p.name for p in sweep.iterdir()] == [TABLE]
    from_table = load_results([sweep])
    pd.testing.assert_frame_equal(from_table, from_dirs)
    write_table(from_table, tmp_path / "table")
    for name in ("table.csv", "table.md"):
        assert (tmp_path / "table" / name).read_bytes() == (tmp_path / "dirs" / name).read_bytes()


def test_a_directory_that_is_there_is_read_instead_of_its_packed_copy(sweep):
    pack(sweep)
    first = sorted(sweep.rglob("summary.json"))[0]
    changed = json.loads(first.read_text())
    changed["wall_s"] = -1.0
    first.write_text(json.dumps(changed))
    runs = dict(find_runs([sweep]))
    assert len(runs) == 6 and runs[first.parent]["wall_s"] == -1.0


def test_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        find_runs([tmp_path / "nowhere"])
    with pytest.raises(ValueError, match="no summary.json or runs.jsonl.gz under"):
        find_runs([tmp_path])
    with pytest.raises(ValueError, match="nothing to pack"):
        pack(tmp_path)


@pytest.mark.parametrize("sweep_dir", SWEEPS)
def test_committed_tables_regenerate_from_the_packed_runs(tmp_path, sweep_dir):
    d = REPO / sweep_dir
    assert not (d / "runs").exists()
    write_table(load_results([d]), tmp_path)
    for name in ("table.csv", "table.md"):
        assert (tmp_path / name).read_bytes() == (d / name).read_bytes(), name
