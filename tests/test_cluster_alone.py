"""The one-replica check of the cluster workloads (``experiments.cluster_alone``): a model's
step bias and MAPE by step kind, and the committed document's tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.cluster_alone import render, step_bias
from experiments.cluster_fidelity import REPO


class _Scaled:
    def __init__(self, decode: float, mixed: float) -> None:
        self.decode, self.mixed = decode, mixed

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        return rows[:, -1] * np.where(rows[:, 0] > 0, self.mixed, self.decode)


def test_step_bias_splits_decode_and_mixed_steps_and_skips_empty_ones():
    rows = np.array([
        [0, 4, 100, 0, 0, 0, 0, 0, 0.001],
        [0, 8, 200, 0, 0, 0, 0, 0, 0.002],
        [64, 4, 100, 10, 900, 1, 0, 0, 0.004],
        [0, 0, 0, 0, 0, 0, 0, 0, 0.5],
    ])
    out = step_bias(_Scaled(0.9, 1.25), rows)
    assert out["decode"]["steps"] == 2 and out["mixed"]["steps"] == 1
    assert out["decode"]["bias_pct"] == pytest.approx(-10.0)
    assert out["mixed"]["bias_pct"] == pytest.approx(25.0)
    assert out["mixed"]["mape_pct"] == pytest.approx(25.0)


def test_the_committed_document_renders_every_case():
    path = REPO / "results" / "cluster_fidelity" / "alone.json"
    if not path.exists():
        pytest.skip(f"{path} not committed")
    doc = json.loads(path.read_text())
    text = render(doc)
    assert all(f"| {c['case']} |" in text for c in doc["cases"])
    assert {c["case"] for c in doc["cases"]} == {
        c["case"] for c in json.loads((path.parent / "engine_alone.json").read_text())
    }
