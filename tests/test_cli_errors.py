"""A user's mistake on the command line: one line naming the field and value, exit status 2,
no run directory left behind; ``HYDRA_FULL_ERROR=1`` shows the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith("error: ")
    return lines[0]


def test_missing_sharegpt_file(tmp_path):
    missing = tmp_path / "nope.json"
    proc = run(f"data.sharegpt_path={missing}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert error_line(proc) == f"error: data.sharegpt_path={missing}: no such file: {missing}"
    assert not (tmp_path / "run").exists()  # hydra's copies are removed with it


def test_garbage_json_file(tmp_path):
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"not": "a list", ')
    proc = run(f"data.sharegpt_path={garbage}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith(f"error: data.sharegpt_path={garbage}: ")
    assert "not a JSON array of conversations" in line


def test_missing_trace_directory(tmp_path):
    nowhere = tmp_path / "traces"
    proc = run("workload=azure_conv", f"data.trace_dir={nowhere}", f"hydra.run.dir={tmp_path}/r")
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith(f"error: data.trace_dir={nowhere}: no AzureLLMInferenceTrace_conv")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.name=nope", "error: unknown policy 'nope'; known: fcfs"),
        ("rate=-2", "error: rate must be a finite number > 0 (requests/s), got -2.0"),
        ("num_requests=6000", "error: too few ShareGPT requests: num_requests=6000"),
        ("scheduler.max_num_seqs=1024", "error: scheduler.max_num_seqs=1024: cost model"),
    ],
)
def test_bad_values_and_names(tmp_path, override, message):
    proc = run(override, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert error_line(proc).startswith(message)
    assert not (tmp_path / "run").exists()


def test_full_error_shows_the_traceback(tmp_path):
    proc = run(
        "data.sharegpt_path=/nonexistent/sharegpt.json",
        f"hydra.run.dir={tmp_path}",
        env={"HYDRA_FULL_ERROR": "1"},
    )
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "ConfigError: data.sharegpt_path=/nonexistent/sharegpt.json" in proc.stderr
