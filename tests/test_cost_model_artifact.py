"""The engine-fitted cost model is fitted once per calibration file (cost_model_artifact.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cost_model_artifact import fit_path, load_fitted, sha256_of
from simulator.engine_cost_model import EngineCostModel, write_steps
from tests.test_engine_cost_model import _synthetic


@pytest.fixture
def calibration(tmp_path):
    path = tmp_path / "h200_tiny_online.csv.gz"
    rng = np.random.default_rng(3)
    rows = _synthetic(400, seed=1)
    rows[:, -1] *= rng.lognormal(0.0, 0.05, len(rows))  # measured steps scatter
    write_steps(rows, path, {"gpu": "H200", "model": "tiny", "knee_tokens": 384})
    return path


def _no_fit(*args, **kwargs):
    raise AssertionError("fitted again")


def test_the_first_load_fits_and_writes_the_artifact_later_loads_read_it(calibration, monkeypatch):
    fresh = EngineCostModel.from_file(calibration)
    first = load_fitted(calibration)
    assert fit_path(calibration).name == "h200_tiny_online.fit.json"
    assert fit_path(calibration).exists()
    monkeypatch.setattr(EngineCostModel, "fit", classmethod(_no_fit))
    second = load_fitted(calibration)
    assert first == fresh and second == fresh  # the same coefficients, bit for bit
    assert second.decode_coef == fresh.decode_coef and second.mixed_coef == fresh.mixed_coef
    assert second.knee == fresh.knee == 384
    plan_rows = _synthetic(50, seed=9)
    np.testing.assert_array_equal(second.predict_rows(plan_rows), fresh.predict_rows(plan_rows))


def test_provenance_names_both_files_and_their_digests(calibration):
    model = load_fitted(calibration)
    p = model.provenance
    assert p["calibration"] == str(calibration) and p["fit"] == str(fit_path(calibration))
    assert p["calibration_sha256"] == sha256_of(calibration)
    assert p["fit_sha256"] == sha256_of(fit_path(calibration))
    doc = json.loads(fit_path(calibration).read_text())
    assert doc["calibration_sha256"] == p["calibration_sha256"]


def test_changed_calibration_bytes_are_fitted_again(calibration):
    load_fitted(calibration)
    rows = _synthetic(400, seed=2)
    write_steps(rows, calibration, {"gpu": "H200", "model": "tiny", "knee_tokens": 384})
    refit = load_fitted(calibration)
    assert refit == EngineCostModel.from_file(calibration)
    assert json.loads(fit_path(calibration).read_text())["calibration_sha256"] == sha256_of(
        calibration
    )


def test_a_damaged_artifact_is_fitted_again(calibration):
    load_fitted(calibration)
    fit_path(calibration).write_text("{ not json")
    assert load_fitted(calibration) == EngineCostModel.from_file(calibration)
    json.loads(fit_path(calibration).read_text())  # rewritten whole


def test_residuals_from_the_artifact_equal_a_fresh_fit(calibration):
    fresh = EngineCostModel.from_file(calibration)
    load_fitted(calibration)
    loaded = load_fitted(calibration, residuals=True)
    assert load_fitted(calibration).residuals is None
    for a, b in zip(loaded.residuals, fresh.residuals):
        np.testing.assert_array_equal(a, b)
    assert loaded.with_noise(5).provenance == loaded.provenance


def test_a_missing_calibration_file_names_it(tmp_path):
    with pytest.raises(ValueError, match="nowhere.csv.gz"):
        load_fitted(tmp_path / "nowhere.csv.gz")
    assert not list(tmp_path.iterdir())
