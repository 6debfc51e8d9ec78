"""``executor.cold_start`` end to end on the CPU (tiny shape, Triton kernels through the
interpreter, fresh spawned processes) and ``simulator.startup_model`` on a hand-written
calibration."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.startup_model import StartupModel

REPO = Path(__file__).resolve().parents[1]
PHASES = [
    "process_start",
    "cuda_init",
    "weight_load",
    "h2d_copy",
    "kv_alloc",
    "warmup",
    "first_step",
]


def _run_cold_start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "executor.cold_start", "--device", "cpu", "--tmp-dir",
         str(tmp_path), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("cold_start")
    out = tmp / "cold_start.json"
    proc = _run_cold_start(
        tmp, "--shapes", "tiny", "--num-blocks", "64", "--repeats", "2",
        "--attention-backend", "triton", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-2].startswith("shape")  # the table is last
    assert [p.name for p in tmp.iterdir()] == ["cold_start.json"]  # the checkpoint is gone
    return json.loads(out.read_text())


def test_every_phase_is_timed_and_sums_to_the_total(calibration):
    doc = calibration
    assert doc["format"] == "horizon.cold_start/1"
    assert doc["phases"] == PHASES and doc["byte_phases"] == ["weight_load", "h2d_copy"]
    assert doc["device"] == "cpu" and doc["dtype"] == "float32"
    assert doc["torch"] and doc["triton"] and doc["date"] and doc["gpu"] is None
    tiny = doc["shapes"]["tiny"]
    assert len(tiny["runs"]) == 2 and tiny["num_blocks"] == 64
    for run in tiny["runs"]:
        assert list(run["phases"]) == PHASES
        assert all(t > 0 for t in run["phases"].values())
        assert run["total"] == pytest.approx(sum(run["phases"].values()), rel=1e-12)
        assert run["page_cache_dropped"] is (hasattr(os, "posix_fadvise"))
    for p in PHASES:
        values = [r["phases"][p] for r in tiny["runs"]]
        s = tiny["phases"][p]
        assert s["min"] == min(values) and s["max"] == max(values)
        assert s["min"] <= s["median"] <= s["max"]
    totals = [r["total"] for r in tiny["runs"]]
    assert tiny["total"]["median"] == pytest.approx(sum(totals) / 2)


def test_weight_bytes_are_the_models_parameter_bytes(calibration):
    import torch

    from executor.model import CausalLM
    from executor.model.testing import tiny_config

    model = CausalLM(tiny_config(), dtype=torch.float32)
    tiny = calibration["shapes"]["tiny"]
    assert tiny["weight_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert tiny["num_params"] == tiny_config().shape.num_params
    assert tiny["file_bytes"] > tiny["weight_bytes"]  # plus the header
    assert StartupModel.from_calibration(calibration).delay("tiny") == pytest.approx(
        sum(tiny["phases"][p]["median"] for p in PHASES)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shapes", "nope", "--num-blocks", "8"], "--shapes"),
        (["--shapes", "tiny"], "--num-blocks is required"),
        (["--shapes", "tiny", "--num-blocks", "0"], "--num-blocks must be >= 1"),
        (["--shapes", "tiny", "--num-blocks", "8", "--repeats", "0"], "--repeats"),
    ],
)
def test_bad_options_name_themselves(capsys, args, message):
    from executor.cold_start import parse_options

    with pytest.raises(SystemExit) as e:
        parse_options(["--device", "cpu", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


# -- StartupModel --------------------------------------------------------------------------------
def hand_calibration() -> dict:
    """Two shapes; load and h2d proportional to bytes (1 GB: 0.5 + 0.1 s, 15 GB: 7.5 + 1.5 s)."""

    def phases(load: float, h2d: float, warmup: float) -> dict:
        s = {"process_start": 4.0, "cuda_init": 1.0, "weight_load": load, "h2d_copy": h2d,
             "kv_alloc": 0.2, "warmup": warmup, "first_step": 0.3}  # fmt: skip
        return {p: {"median": v, "min": v, "max": v} for p, v in s.items()}

    return {
        "phases": PHASES,
        "byte_phases": ["weight_load", "h2d_copy"],
        "shapes": {
            "small": {"weight_bytes": 10**9, "phases": phases(0.5, 0.1, 10.0)},
            "big": {"weight_bytes": 15 * 10**9, "phases": phases(7.5, 1.5, 20.0)},
        },
    }


def test_delay_is_the_sum_of_the_measured_phases(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(hand_calibration()))
    model = StartupModel.load(path)
    assert model.delay("small") == pytest.approx(4 + 1 + 0.5 + 0.1 + 0.2 + 10 + 0.3)
    assert model.delay("big") == pytest.approx(4 + 1 + 7.5 + 1.5 + 0.2 + 20 + 0.3)
    b = model.breakdown("big")
    assert not b.extrapolated and b.reference == "big" and b.byte_ratio == 1.0
    assert list(b.phases) == PHASES and b.total == model.delay("big")


def test_extrapolation_scales_only_the_byte_phases_linearly():
    model = StartupModel.from_calibration(hand_calibration())
    small = model.breakdown("small").phases
    for ratio in (0.5, 2.0, 3.0):  # nearest to 1 GB (3 GB: log-distance 1.1 vs 1.6)
        b = model.extrapolate(int(ratio * 10**9))
        assert b.extrapolated and b.reference == "small" and b.byte_ratio == pytest.approx(ratio)
        assert b.scaled_phases == ("weight_load", "h2d_copy")
        for p in PHASES:
            want = small[p] * ratio if p in b.scaled_phases else small[p]
            assert b.phases[p] == pytest.approx(want)
    b = model.extrapolate(16 * 10**9)  # nearest: big
    assert b.reference == "big" and b.phases["weight_load"] == pytest.approx(7.5 * 16 / 15)
    assert b.phases["warmup"] == 20.0
    exact = model.extrapolate(15 * 10**9)
    assert exact.total == pytest.approx(model.delay("big")) and exact.extrapolated


def test_scaled_multiplies_every_delay():
    model = StartupModel.from_calibration(hand_calibration())
    x2, x10 = model.scaled(2), model.scaled(2).scaled(5)
    assert x2.delay("small") == pytest.approx(2 * model.delay("small"))
    assert x10.delay("big") == pytest.approx(10 * model.delay("big"))
    assert x10.extrapolate(3 * 10**9).total == pytest.approx(
        10 * model.extrapolate(3 * 10**9).total
    )
    assert x2.breakdown("big").factor == 2.0 and model.factor == 1.0  # the original unchanged


def _broken(path: list, value) -> dict:  # noqa: ANN001
    cal = hand_calibration()
    node = cal
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return cal


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["phases"], "warmup", "'phases'"),
        (["byte_phases"], ["weight_load", "nope"], "byte_phases"),
        (["shapes"], {}, "'shapes'"),
        (["shapes", "big", "weight_bytes"], 0, "shapes['big'].weight_bytes"),
        (["shapes", "big", "weight_bytes"], KeyError, "shapes['big'] lacks field 'weight_bytes'"),
        (["shapes", "big", "phases", "warmup", "median"], -1.0, "shapes['big'].phases.warmup"),
        (["shapes", "big", "phases", "warmup", "median"], math.nan, "phases.warmup.median"),
        (["shapes", "big", "phases", "warmup"], 3.0, "shapes['big'].phases.warmup"),
        (["shapes", "big", "phases", "warmup"], KeyError, "shapes['big'].phases must be"),
    ],
)
def test_bad_calibrations_name_the_field(path, value, field):
    with pytest.raises(ValueError) as e:
        StartupModel.from_calibration(_broken(path, value))
    assert field in str(e.value)


def test_bad_arguments_raise():
    model = StartupModel.from_calibration(hand_calibration())
    with pytest.raises(ValueError, match="shape_name 'huge' was not measured; known: big, small"):
        model.delay("huge")
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="weight_bytes"):
            model.extrapolate(bad)
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="factor"):
            model.scaled(bad)
