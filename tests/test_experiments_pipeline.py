"""End to end: a tiny sweep, a multirun read by the plotter, reproducible records, CLI errors.

A small synthetic ShareGPT file and its token cache live in a tmp dir, so nothing here touches
the repository's data/cache or needs the 12 s tokenisation of the packaged corpus.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.config_store import register_configs
from experiments.plot import report
from experiments.records_io import read_records
from experiments.run import execute

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def data(tiny_sharegpt: list[str]) -> list[str]:
    return tiny_sharegpt


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_quick_sweep_writes_runs_table_and_figures(tmp_path, data):
    out = tmp_path / "sweep"
    proc = run_module(
        "experiments.sweep",
        "sweep=quick",
        "sweep.num_requests=60",
        "sweep.rates=[20,400]",
        *data,
        f"hydra.run.dir={out}",
    )
    assert proc.returncode == 0, proc.stderr
    assert "run 4/4" in proc.stdout and "table.csv" in proc.stdout
    runs = sorted((out / "runs").iterdir())
    assert [r.name for r in runs] == [
        "fcfs_rate20_seed0",
        "fcfs_rate400_seed0",
        "sjf_prompt_rate20_seed0",
        "sjf_prompt_rate400_seed0",
    ]
    for r in runs:
        assert {"config.yaml", "summary.json", "records"} <= {p.name for p in r.iterdir()}
        assert (r / "records" / "requests.parquet").is_file()
    s = json.loads((runs[0] / "summary.json").read_text())
    assert s["run"]["policy"] == "fcfs" and s["run"]["num_blocks"] == 3000
    assert s["run"]["slo"] == {"name": "h200_7b", "ttft": 1.0, "itl": 0.05}
    assert set(s["goodput"]) == {"goodput_lifetime", "goodput_tpot"}
    assert s["workload"]["cache_path"] == str(Path(data[1].split("=", 1)[1]).resolve())
    assert s["workload"]["truncated"] is False
    assert 0 <= s["metrics"]["goodput_lifetime"] <= 1
    table = pd.read_csv(out / "table.csv")
    assert len(table) == 4 and set(table["policy"]) == {
        "fcfs",
        "sjf_prompt(aging_tokens_per_s=100)",
    }
    assert "goodput_lifetime_mean" in table and "recompute_waste_max" in table
    assert "| fcfs | 20 | 1 |" in (out / "table.md").read_text()
    for png in ("goodput_vs_load.png", "latency_cdf.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_reads_a_multirun_dir(tmp_path, data):
    mr = tmp_path / "multirun"
    proc = run_module(
        "experiments.run",
        "-m",
        "policy=fcfs,memory_first",
        "rate=10,300",
        "num_requests=50",
        "model.num_blocks=400",
        *data,
        f"hydra.sweep.dir={mr}",
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list(mr.rglob("summary.json"))) == 4
    assert (mr / "0_fcfs_rate10.0_seed0" / ".hydra" / "config.yaml").is_file()
    proc = run_module("experiments.plot", str(mr), "--rate", "300")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(mr / "table.csv")
    assert sorted(zip(table["policy"], table["rate"], strict=True)) == [
        ("fcfs", 10.0),
        ("fcfs", 300.0),
        ("memory_first", 10.0),
        ("memory_first", 300.0),
    ]
    assert (table["num_blocks"] == 400).all()
    assert (mr / "goodput_vs_load.png").stat().st_size > 0
    assert (mr / "latency_cdf.png").stat().st_size > 0


def test_same_config_and_seed_give_byte_identical_records(tmp_path, data):
    register_configs()
    overrides = [
        "policy=sjf_prompt",
        "rate=200",
        "seed=4",
        "num_requests=80",
        "model.num_blocks=300",
        *data,
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("run", overrides=overrides))
    first, second = execute(cfg, tmp_path / "a"), execute(cfg, tmp_path / "b")
    assert first["metrics"] == second["metrics"]
    assert first["metrics"]["preemptions"] > 0  # the KV budget binds: the test is not vacuous
    files = sorted(p.name for p in (tmp_path / "a" / "records").iterdir())
    assert files == ["meta.json", "requests.parquet", "steps.parquet"]
    for name in files:
        a = (tmp_path / "a" / "records" / name).read_bytes()
        assert a == (tmp_path / "b" / "records" / name).read_bytes(), name
    assert read_records(tmp_path / "a" / "records").num_requests == 80


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rate=-2", "rate must be a finite number > 0 (requests/s), got -2.0"),
        ("policy=nope", "Could not find 'policy/nope'"),
        ("policy.name=nope", "unknown policy 'nope'; known: fcfs, "),
        ("model=nope", "Could not find 'model/nope'"),
    ],
)
def test_cli_errors_are_clear(tmp_path, override, message):
    proc = run_module("experiments.run", override, f"hydra.run.dir={tmp_path}")
    assert proc.returncode != 0
    assert message in proc.stderr


def test_report_on_single_run_dirs(tmp_path, data):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfgs = [
            OmegaConf.to_object(
                compose("run", overrides=[f"policy={p}", "rate=50", "num_requests=40", *data])
            )
            for p in ("fcfs", "oracle_srpt")
        ]
    dirs = [tmp_path / c.policy.name for c in cfgs]
    for c, d in zip(cfgs, dirs, strict=True):
        execute(c, d)
    written = report(dirs, tmp_path / "out")
    assert {p.name for p in written} == {
        "table.csv",
        "table.md",
        "goodput_vs_load.png",
        "latency_cdf.png",
    }
