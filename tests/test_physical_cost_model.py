from dataclasses import asdict

import numpy as np
import pytest

from horizon.metrics import summarize
from horizon.metrics.records import STATUS_FINISHED
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.request import SLO, Request
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.cost_model_artifact import physical_fit_path, sha256_of
from simulator.engine_cost_model import Buckets, step_rows, write_steps
from simulator.physical_cost_model import PhysicalCostModel, physical_features

TRUE = (4e-3, 6e-3, 2e-6, 1.5e-3, 1e-10, 2e-6, 1e-6, 2e-4)


def _steps(rng, n, ctx_scale=1.0):
    d = rng.integers(1, 200, n).astype(float)
    p = np.where(rng.random(n) < 0.4, rng.integers(1, 1800, n), 0).astype(float)
    dctx = d * rng.integers(100, 1500, n) * ctx_scale
    pctx = np.where(p > 0, rng.integers(0, 2000, n) * ctx_scale, 0)
    pairs = p * (pctx + p / 2)
    chunks = (p > 0).astype(float)
    rows = np.stack(
        [p, d, dctx, pctx, pairs, chunks, rng.integers(0, 5, n), np.zeros(n), np.zeros(n)], 1
    )
    rows[:, -1] = physical_features(rows, Buckets(), 57344) @ np.array(TRUE)
    return rows


def test_fit_recovers_coefficients_and_extrapolates_to_4x_context():
    rng = np.random.default_rng(0)
    m = PhysicalCostModel.fit(_steps(rng, 3000))
    assert np.allclose(m.coef[:5], TRUE[:5], rtol=0.05)
    far = _steps(rng, 500, ctx_scale=4.0)
    err = np.abs(m.predict_rows(far) / far[:, -1] - 1)
    assert err.mean() < 0.01


# --- the registered cost model ("physical"), fitted once per calibration file -------------


@pytest.fixture
def calibration(tmp_path):
    """An online-steps file of the 7B shape: steps timed by ``TRUE`` with 3% scatter."""
    rng = np.random.default_rng(4)
    rows = _steps(rng, 2000)
    rows[:, -1] *= rng.lognormal(0.0, 0.03, len(rows))
    path = tmp_path / "h200_qwen2.5-7b_online.csv.gz"
    meta = {"gpu": "NVIDIA H200", "model": "qwen2.5-7b", "buckets": asdict(Buckets())}
    write_steps(rows, path, meta)
    return path


def _make(path, shape="qwen2.5-7b", name="physical"):
    return make_cost_model(name, shape=model_shape(shape), gpu=gpu_spec("H200"), path=str(path))


def test_registered_by_name_and_import_path_fitted_once_per_file(calibration, monkeypatch):
    fresh = PhysicalCostModel.from_file(calibration, "qwen2.5-7b")
    first = _make(calibration)
    assert physical_fit_path(calibration).exists()
    assert first == fresh  # the artifact's coefficients are the fit's, bit for bit

    def refuse(*args, **kwargs):
        raise AssertionError("fitted again")

    monkeypatch.setattr(PhysicalCostModel, "fit", classmethod(refuse))
    again = _make(calibration, name="simulator.cost_models.physical")  # hydra's _target_
    assert again == fresh
    assert again.provenance["calibration_sha256"] == sha256_of(calibration)
    assert again.provenance["fit"] == str(physical_fit_path(calibration))


def test_refuses_a_file_measured_for_another_shape(calibration):
    with pytest.raises(ValueError, match="measured with model qwen2.5-7b, not qwen2.5-0.5b"):
        _make(calibration, shape="qwen2.5-0.5b")


def _requests(n=120, seed=0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40.0, n))
    return [
        Request(i, float(t), int(rng.integers(20, 1500)), 400, int(rng.integers(5, 300)))
        for i, t in enumerate(arrivals)
    ]


def test_a_simulation_on_it_times_every_step_as_predict_rows_does(calibration):
    cost = _make(calibration)
    config = SchedulerConfig(num_blocks=600, max_num_seqs=256, max_num_batched_tokens=2048)
    rec = Simulation(_requests(), config, make_policy("fcfs"), cost).run()
    rec.check()
    assert (rec.status == STATUS_FINISHED).all()
    rows = step_rows(rec)
    assert (rows[:, 0] > 0).any() and (rows[:, 0] == 0).any()  # mixed and decode-only steps
    assert rows[:, 1].max() >= 10 and rows[:, 2].max() > 5_000  # batched decodes, long KV
    np.testing.assert_allclose(rows[:, -1], cost.predict_rows(rows), rtol=1e-9)
    summary = summarize(rec, slo=SLO(ttft=1.0, itl=0.05))
    assert 0 < summary["ttft_mean"] < summary["e2e_mean"]
    assert rec.step_durations().sum() <= rec.step_end[-1] + 1e-9  # steps never overlap


def test_a_uniform_bias_scales_every_simulated_step(calibration):
    cost = _make(calibration)
    config = SchedulerConfig(num_blocks=600)
    base = Simulation(_requests(), config, make_policy("fcfs"), cost).run()
    slow = Simulation(_requests(), config, make_policy("fcfs"), cost.scaled(1.01)).run()
    rows = step_rows(slow)
    np.testing.assert_allclose(rows[:, -1], 1.01 * cost.predict_rows(rows), rtol=1e-9)
    assert slow.step_end[-1] > base.step_end[-1]
    with pytest.raises(ValueError, match="scale factor"):
        cost.scaled(0.0)


def test_the_sim_physical_backend_config_builds_it(calibration):
    from experiments.components import build_components
    from experiments.config_store import run_config

    cfg = run_config(
        [
            "backend=sim_physical",
            "model=qwen2.5-7b",
            f"backend.cost_model_options.path={calibration}",
        ]
    )
    cost = build_components(cfg).cost_model
    assert cost == PhysicalCostModel.from_file(calibration, "qwen2.5-7b")
    assert cost.provenance["fit"] == str(physical_fit_path(calibration))
