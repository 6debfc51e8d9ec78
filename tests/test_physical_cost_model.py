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
from simulator.clock_state import ClockStateCost, ClockTable
from simulator.cost_model_artifact import physical_fit_path, sha256_of
from simulator.engine_cost_model import Buckets, step_rows, write_steps
from simulator.physical_cost_model import (
    COMPUTE,
    MEMORY,
    PhysicalCostModel,
    grid_path,
    grid_rows,
    physical_features,
    tflop_per,
)

# memory side (its 6th: 0.1 ms per 1,000 tokens of a mixed step's longest walk), compute side
# (s per TFLOP: 625 and 286 TFLOP/s), host (last: online host work)
TRUE = (4e-3, 6e-3, 2e-6, 1.5e-3, 1e-10, 1e-4, 1.6e-3, 3.5e-3, 2e-6, 1e-6, 2e-4, 5e-4)
TFLOPS = tflop_per(model_shape("qwen2.5-7b"))
NM, NC = len(MEMORY), len(COMPUTE)


def _sides(rows):
    """(memory, compute) seconds of ``rows`` under ``TRUE``."""
    memory, compute, _ = physical_features(rows, Buckets(), 57344, TFLOPS)
    c = np.array(TRUE)
    return memory @ c[:NM], compute @ c[NM : NM + NC]


def _time(rows, online=True):
    """``TRUE``'s seconds of ``rows``: max(memory, compute) + host (less the online host
    work for offline steps)."""
    _, _, host = physical_features(rows, Buckets(), 57344, TFLOPS)
    host[:, -1] = 1.0 if online else 0.0
    return np.maximum(*_sides(rows)) + host @ np.array(TRUE)[NM + NC :]


def _steps(rng, n, ctx_scale=1.0, max_prefill=2048, online=True):
    d = rng.integers(1, 200, n).astype(float)
    p = np.where(rng.random(n) < 0.4, rng.integers(1, max_prefill + 1, n), 0).astype(float)
    p = np.minimum(p, np.maximum(2048 - d, 0))  # the step's token budget
    dctx = d * rng.integers(100, 1500, n) * ctx_scale
    pctx = np.where(p > 0, p + rng.integers(0, 2000, n) * ctx_scale, 0)
    pairs = p * (pctx - p) + p * (p + 1) / 2
    chunks = (p > 0).astype(float)
    longest = np.minimum(dctx, dctx / d * rng.uniform(1, 3, n))  # between the mean and all
    rows = np.stack(
        [p, d, dctx, pctx, pairs, chunks, rng.integers(0, 5, n), np.zeros(n), longest, 0 * d], 1
    )  # refreshed; none preempting; step_s
    rows[:, -1] = _time(rows, online)
    return rows


def test_the_knee_recovers_both_sides_coefficients_and_extrapolates_to_4x_context():
    rng = np.random.default_rng(0)
    rows = _steps(rng, 3000)
    memory, compute = _sides(rows)
    assert 0.1 < (compute > memory).mean() < 0.9  # steps on both sides of the knee
    m = PhysicalCostModel.fit(rows)
    assert m.tflops == TFLOPS
    assert np.allclose(m.coef[: NM + NC], TRUE[: NM + NC], rtol=0.02)  # memory and compute sides
    assert m.coef[-1] == pytest.approx(TRUE[-1], rel=0.05)
    far = _steps(rng, 500, ctx_scale=4.0)
    err = np.abs(m.predict_rows(far) / far[:, -1] - 1)
    assert err.mean() < 0.01


def test_the_grid_calibrates_the_compute_side_online_steps_never_reach():
    """Online steps of <= 192 prefill tokens, all memory-bound; the offline grid's long
    chunks (without the online host work) price the 2,048-token steps."""
    rng = np.random.default_rng(1)
    online = _steps(rng, 3000, max_prefill=192)
    memory, compute = _sides(online)
    online = online[compute < memory]
    assert len(online) > 2000
    grid = _steps(rng, 40, max_prefill=2048, online=False)
    grid = grid[grid[:, 0] >= 1024]
    full = _steps(rng, 2000)
    full = full[full[:, 0] >= 1800]
    with_grid = PhysicalCostModel.fit(online, grid=grid)
    err = np.abs(with_grid.predict_rows(full) / full[:, -1] - 1)
    assert err.max() < 0.01
    assert np.allclose(with_grid.coef[NM : NM + NC], TRUE[NM : NM + NC], rtol=0.02)
    # no step is compute-bound both online and offline: only the online steps' constant,
    # graph launch plus online host work, is known, not how it splits
    assert with_grid.coef[1] + with_grid.coef[-1] == pytest.approx(TRUE[1] + TRUE[-1], rel=0.01)
    alone = PhysicalCostModel.fit(online)  # no compute side to learn: underpriced
    assert np.mean(alone.predict_rows(full) / full[:, -1]) < 0.8


def test_grid_rows_reads_the_profilers_long_chunks(tmp_path):
    path = tmp_path / "h200_qwen2.5-7b.csv"
    path.write_text(
        "num_prefill_tokens,num_decodes,decode_context_tokens,prefill_context_tokens,"
        "prefill_attention_pairs,num_prefills,step_s,step_s_p10,step_s_p90,kind,cuda_graph\n"
        "0,2,254,0,0,0,0.0045,0.0045,0.0046,decode,True\n"
        "2048,0,0,5120,8389632,1,0.0577,0.057,0.058,prefill,True\n"
    )
    rows = grid_rows(path)
    assert rows.shape == (1, 10)
    assert rows[0].tolist() == [2048, 0, 0, 5120, 8389632, 1, 0, 0, 0, 0.0577]
    assert grid_path(tmp_path / "h200_qwen2.5-7b_online.csv.gz") == path
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a profiler grid"):
        grid_rows(bad)


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


FLOOR = 1e9 / gpu_spec("H200").mem_bandwidth  # the registered model's default KV floor


def _make(path, shape="qwen2.5-7b", name="physical", **options):
    return make_cost_model(
        name, shape=model_shape(shape), gpu=gpu_spec("H200"), path=str(path), **options
    )


def test_registered_by_name_and_import_path_fitted_once_per_file(calibration, monkeypatch):
    fresh = PhysicalCostModel.from_file(calibration, "qwen2.5-7b", FLOOR)
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


def test_the_bucket_offsets_option_is_fitted_and_kept_in_its_own_artifact(
    calibration, monkeypatch
):
    import json

    import simulator.cost_models

    BUCKET_MIN_STEPS = 20  # the file's 2,000 steps give each bucket fewer than the default
    monkeypatch.setattr(simulator.cost_models, "BUCKET_MIN_STEPS", BUCKET_MIN_STEPS)
    plain = _make(calibration)
    with_offsets = _make(calibration, bucket_offsets=True)
    fresh = PhysicalCostModel.from_file(calibration, "qwen2.5-7b", FLOOR,
                                        bucket_min_steps=BUCKET_MIN_STEPS)  # fmt: skip
    assert plain.decode_offsets == () and with_offsets == fresh
    assert any(v != 0 for v in with_offsets.decode_offsets)
    doc = json.loads(physical_fit_path(calibration).read_text())
    assert doc["bucket_min_steps"] == BUCKET_MIN_STEPS
    assert doc["decode_offsets"] == list(fresh.decode_offsets)
    assert _make(calibration, bucket_offsets=True) == fresh  # read back from the artifact


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
    table = ClockTable.from_duty_cycle("results/duty_cycle/h200_qwen2.5-7b.json")
    assert isinstance(cost, ClockStateCost) and cost.table == table
    assert cost.base == PhysicalCostModel.from_file(calibration, "qwen2.5-7b", FLOOR, table)
    assert cost.provenance["fit"] == str(physical_fit_path(calibration))


def test_a_grid_beside_the_file_is_fitted_and_named_by_the_artifact(calibration):
    import json

    rng = np.random.default_rng(5)
    grid = _steps(rng, 60, online=False)
    grid = grid[grid[:, 0] >= 1024]
    head = "num_prefill_tokens,num_decodes,decode_context_tokens,prefill_context_tokens,"
    head += "prefill_attention_pairs,num_prefills,step_s,step_s_p10,step_s_p90,kind,cuda_graph"
    lines = [",".join(f"{v:.9g}" for v in (*r[:6], r[-1], r[-1], r[-1])) + ",prefill,True"
             for r in grid]  # fmt: skip
    gpath = grid_path(calibration)
    gpath.write_text("\n".join([head, *lines]) + "\n")
    model = _make(calibration)
    assert model.meta["grid"] == gpath.name
    fit = PhysicalCostModel.fit(*_online(calibration), grid=grid_rows(gpath), kv_floor=FLOOR)
    assert model == fit
    doc = json.loads(physical_fit_path(calibration).read_text())
    assert doc["grid_sha256"] == sha256_of(gpath)
    gpath.write_text("\n".join([head, *lines[:-1]]) + "\n")  # another grid: fitted again
    assert _make(calibration) != model


def test_the_floor_and_the_clock_are_options_the_artifact_is_keyed_by(calibration):
    import json

    clock = "results/duty_cycle/h200_qwen2.5-7b.json"
    table = ClockTable.from_duty_cycle(clock)
    hot = _make(calibration, clock=clock)
    assert isinstance(hot, ClockStateCost) and hot.table == table
    assert hot.base == PhysicalCostModel.from_file(calibration, "qwen2.5-7b", FLOOR, table)
    doc = json.loads(physical_fit_path(calibration).read_text())
    assert doc["kv_floor"] == FLOOR and doc["clock_sha256"] == sha256_of(clock)
    assert hot.provenance["clock_sha256"] == sha256_of(clock)
    bare = _make(calibration, kv_floor=False)  # another key: fitted again, not the artifact's
    assert bare == PhysicalCostModel.from_file(calibration, "qwen2.5-7b")
    assert bare.kv_floor == 0.0 and json.loads(physical_fit_path(calibration).read_text())[
        "clock_sha256"] is None  # fmt: skip
    noisy = _make(calibration, clock=clock, noise_seed=3)
    assert isinstance(noisy, ClockStateCost) and noisy.base.seed == 3
    with pytest.raises(ValueError, match="measured with model qwen2.5-0.5b, not qwen2.5-7b"):
        _make(calibration, clock="results/duty_cycle/h200_qwen2.5-0.5b.json")
    with pytest.raises(ValueError, match="clock: duty-cycle file nope.json does not exist"):
        _make(calibration, clock="nope.json")


def _online(path):
    from simulator.engine_cost_model import read_steps

    rows, meta = read_steps(path)
    return rows, "qwen2.5-7b", Buckets(**meta["buckets"])


def test_the_kv_floor_prices_kv_bytes_at_the_bandwidth_and_the_fit_keeps_the_rest():
    """Steps whose KV read costs 1 / 4.2 TB/s per byte on top of ``TRUE``: the fit with that
    floor recovers ``TRUE`` and its price, and scaling scales the floor with the rest."""
    floor = 1e9 / 4.2e12
    rng = np.random.default_rng(4)
    rows = _steps(rng, 3000)
    kv_gb = (rows[:, 2] + rows[:, 3]) * 57344 / 1e9
    rows[:, -1] += floor * kv_gb
    m = PhysicalCostModel.fit(rows, kv_floor=floor)
    assert m.kv_floor == floor
    assert np.allclose(m.coef[: NM + NC], TRUE[: NM + NC], rtol=0.02, atol=1e-9)
    far = _steps(rng, 500, ctx_scale=4.0)
    far[:, -1] += floor * (far[:, 2] + far[:, 3]) * 57344 / 1e9
    assert np.abs(m.predict_rows(far) / far[:, -1] - 1).mean() < 0.01
    assert np.allclose(m.scaled(1.1).predict_rows(far), 1.1 * m.predict_rows(far))
    with pytest.raises(ValueError, match="kv_floor"):
        PhysicalCostModel(TRUE, 57344, kv_floor=-1.0)


def test_step_time_of_a_plan_is_predict_rows_of_its_row():
    from types import SimpleNamespace

    m = PhysicalCostModel(TRUE, 57344, Buckets(), TFLOPS, kv_floor=2.4e-4)
    rng = np.random.default_rng(5)
    plans, rows = [], []
    for _ in range(300):
        d, n = int(rng.integers(0, 60)), int(rng.integers(0, 4))
        p = int(rng.integers(1, 600)) * n
        dctx, pctx = d * int(rng.integers(10, 3000)), p + n * int(rng.integers(0, 4000))
        longest = min(dctx, dctx // max(d, 1) * int(rng.integers(1, 4)))
        pairs, ref, pre = int(rng.integers(0, 10**6)) * (n > 0), int(rng.integers(0, 3)), n == 1
        if p + d == 0:
            continue
        plans.append(SimpleNamespace(decodes=(0,) * d, prefills=((0, 1),) * n,
                                     num_prefill_tokens=p, prefill_attention_pairs=pairs,
                                     decode_context_tokens=dctx, prefill_context_tokens=pctx,
                                     num_refreshed=ref, preempted=(1,) * pre,
                                     longest_decode_context=longest))  # fmt: skip
        rows.append([p, d, dctx, pctx, pairs, n, ref, int(pre), longest, 0.0])
    want = m.predict_rows(np.array(rows, dtype=float))
    got = np.array([m.step_time(plan) for plan in plans])
    assert np.allclose(got, want, rtol=1e-12)
    memory, _, _ = physical_features(np.array(rows, dtype=float), Buckets(), 57344, TFLOPS)
    assert memory[:, 5].max() > 1.0  # the longest walk is exercised


def test_decode_bucket_offsets_are_recovered_where_measured_and_zero_elsewhere():
    """Decode-only steps of each batch bucket cost a constant of their own beside the line:
    the fit recovers the offsets of the buckets it saw often enough, signed, leaves the
    others 0 (priced by the line), and the scalar path prices a plan as the rows do."""
    from horizon.plan import StepPlan
    from simulator.physical_cost_model import decode_bucket_index

    rng = np.random.default_rng(3)
    rows = _steps(rng, 6000)
    rows[:, 1] = np.where(rows[:, 0] > 0, rows[:, 1], rng.integers(1, 100, len(rows)))
    buckets = Buckets()
    true_off = np.zeros(len(buckets.decode))
    true_off[:6] = (-4e-4, 3e-4, -2e-4, 5e-4, 1e-4, -1e-4)  # buckets 1, 2, 4, 8, 16, 32
    idx = decode_bucket_index(rows, buckets)
    rows[:, -1] = _time(rows) + np.append(true_off, 0.0)[idx]
    m = PhysicalCostModel.fit(rows, bucket_min_steps=20)
    counts = np.bincount(idx, minlength=len(buckets.decode) + 1)[:-1]
    seen = counts >= 20
    assert seen[:6].all() and not seen.all()  # some buckets (> 99 decodes) never ran
    got = np.array(m.decode_offsets)
    np.testing.assert_allclose(got[seen], true_off[seen], atol=3e-5)
    assert (got[~seen] == 0).all()
    assert np.abs(m.predict_rows(rows) / rows[:, -1] - 1).mean() < 0.01
    assert PhysicalCostModel.fit(rows).decode_offsets == ()  # off by default
    assert m.scaled(2.0).decode_offsets == tuple(2 * v for v in m.decode_offsets)
    for d in (3, 17, 60):  # the scalar path, decode-only plans of three buckets
        plan = StepPlan(0, 0.0, tuple(Request(i, 0.0, 4, 8, 8) for i in range(d)), (),
                        decode_context_tokens=40 * d)  # fmt: skip
        row = np.array([[0, d, 40 * d, 0, 0, 0, 0, 0, 0, 0]], dtype=float)
        assert m.step_time(plan) == pytest.approx(float(m.predict_rows(row)[0]), rel=1e-9)
    with pytest.raises(ValueError, match="decode_offsets"):
        PhysicalCostModel(TRUE, 57344, decode_offsets=(1.0,))
