"""The cost model fitted to the engine's committed H200 calibration files."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizon.model_shape import model_shape
from simulator import gpu_spec, make_cost_model
from simulator.fitted_cost_model import FittedCostModel, held_out_mape

CAL = Path(__file__).resolve().parents[1] / "calibration"


@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "qwen2.5-7b"])
def test_fit_predicts_held_out_measured_steps(shape):
    path = CAL / f"h200_{shape}.csv"
    err = held_out_mape(str(path))
    assert err["rows"] > 100
    assert err["all"] < 6.0  # percent; the figure the results page quotes
    model = make_cost_model("fitted", shape=model_shape(shape), gpu=gpu_spec("H200"), path=path)
    small = model.time_for(0, 1, 128, 0, 0, 0)
    big = model.time_for(0, 256, 256 * 2048, 0, 0, 0)
    mixed = model.time_for(2048, 64, 64 * 512, 2048, 2048 * 2049 // 2, 1)
    assert 0 < small < big and small < mixed  # more work, more time


def test_shape_mismatch_and_bad_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="measured on qwen2.5-0.5b, not qwen2.5-7b"):
        FittedCostModel.from_csv(str(CAL / "h200_qwen2.5-0.5b.csv"), "qwen2.5-7b")
    bad = tmp_path / "x.csv"
    bad.write_text("num_decodes,step_s\n1,0.001\n")
    with pytest.raises(ValueError, match="missing columns"):
        FittedCostModel.from_csv(str(bad), "qwen2.5-7b")
    with pytest.raises(ValueError, match="does not exist"):
        FittedCostModel.from_csv(str(tmp_path / "none.csv"), "qwen2.5-7b")
