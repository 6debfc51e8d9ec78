"""The cost model fitted to the engine's online steps (simulator/engine_cost_model.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from horizon.metrics.records import RunRecords
from horizon.plan import StepPlan
from horizon.request import Request
from horizon.step_buckets import bucket_of, decode_buckets, mixed_token_buckets
from simulator.engine_cost_model import (
    STEP_COLUMNS,
    EngineCostModel,
    mape,
    read_steps,
    step_rows,
    write_steps,
)

GOLDEN = Path(__file__).parent / "data" / "golden"
DEC = (900e-6, 4e-6, 2e-6, 5e-9, 40e-6, 200e-6)
MIX = (1500e-6, 1.5e-6, 0.2e-6, 1e-11, 0.1e-6, 3e-8, 1e-6, 20e-6, 4e-7, 45e-6, 180e-6, 0.0, 3e-7)
# a compute-bound corner at 384 padded tokens: 12 us per token past it
MIX_KNEE = (*MIX[:11], 12e-6, MIX[12])


def _synthetic(
    n: int,
    seed: int,
    mix: tuple[float, ...] = MIX,
    dec: tuple[float, ...] = DEC,
    knee: int = 384,
) -> np.ndarray:
    """Rows whose step_s follows the model's own form exactly (the mixed corner at ``knee``)."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 200, n)
    p = np.where(rng.random(n) < 0.4, rng.integers(1, 1800, n), 0)
    d = np.where((p == 0) & (d == 0), 1, d)
    chunks = np.where(p > 0, rng.integers(1, 4, n), 0)
    pctx = p + rng.integers(0, 3000, n) * (p > 0)
    pairs = p * (pctx - p) + p * (p + 1) // 2
    dctx = d * rng.integers(100, 3000, n)
    # the longest decode: between the mean context and all of it
    longest = np.minimum(dctx, (dctx // np.maximum(d, 1)) * rng.integers(1, 4, n))
    ref = np.where(rng.random(n) < 1 / 16, d, 0)
    pre = np.where(rng.random(n) < 0.1, rng.integers(1, 4, n), 0)
    cols = [p, d, dctx, pctx, pairs, chunks, ref, pre, longest, np.zeros(n)]
    rows = np.stack(cols, 1).astype(float)
    db, mb = decode_buckets(256), mixed_token_buckets(2048)
    for r in rows:
        p_, d_, dctx_, pctx_, pairs_, n_, ref_, pre_, longest_ = r[:9]
        drains = float(pre_ > 0)
        if p_ == 0:
            x = (1, bucket_of(int(d_), db), d_, dctx_, ref_, drains)
            r[9] = np.dot(dec, x)
        else:
            t = p_ + d_
            x = (
                1,
                bucket_of(int(t), mb),
                t,
                pairs_,
                pctx_,
                dctx_,
                d_,
                n_,
                dctx_ / max(d_, 1),
                ref_,
                drains,
                max(bucket_of(int(t), mb) - knee, 0),
                longest_,
            )
            r[9] = np.dot(mix, x)
    return rows


def _graph_intercepts() -> np.ndarray:
    """The decode form's intercept per bucket for DEC (fixed + per-row slope)."""
    return DEC[0] + DEC[1] * np.array(decode_buckets(256), dtype=float)


def test_fit_recovers_the_generating_coefficients_and_predicts_held_out_rows():
    model = EngineCostModel.fit(_synthetic(3000, 0))
    assert model.knee is None  # linear data: no corner to find
    k = len(decode_buckets(256))
    # batches up to 199: the buckets above are filled from the line through the others
    np.testing.assert_allclose(model.decode_coef[:k], _graph_intercepts(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(model.decode_coef[k:], DEC[2:], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(model.mixed_coef, MIX, rtol=1e-5, atol=1e-12)
    err = mape(model, _synthetic(500, 1))
    assert err["all"] < 1e-6 and err["steps"] == 500


def test_fit_finds_the_compute_bound_corner_of_mixed_steps():
    rows = _synthetic(3000, 4, MIX_KNEE)
    model = EngineCostModel.fit(rows)
    assert model.knee == 384
    np.testing.assert_allclose(model.mixed_coef, MIX_KNEE, rtol=1e-5, atol=1e-12)
    assert mape(model, _synthetic(500, 5, MIX_KNEE))["all"] < 1e-6
    # without the corner the linear form misses the large steps
    flat = EngineCostModel.fit(rows, knee=None)
    assert flat.knee is None and mape(flat, _synthetic(500, 5, MIX_KNEE))["mixed"] > 1.0
    # a given knee is used as is (from_file reads the writer's choice back)
    assert EngineCostModel.fit(rows, knee=256).knee == 256
    with pytest.raises(ValueError, match="knee"):
        EngineCostModel.fit(rows, knee=-5)


def test_the_mixed_regime_is_fitted_non_negative():
    """A term that would have to be negative to fit is dropped (0), not made negative: each
    term is work. The decode-only regime is unconstrained."""
    mix = MIX[:6] + (-4e-6,) + MIX[7:]  # a step that got shorter with more decodes
    dec = DEC[:2] + (-1e-6,) + DEC[3:]
    model = EngineCostModel.fit(_synthetic(3000, 3, mix, dec))
    assert min(model.mixed_coef) >= 0
    assert model.mixed_coef[6] == 0
    k = len(decode_buckets(256))
    assert model.decode_coef[k] == pytest.approx(-1e-6, rel=1e-5)


def test_step_time_of_a_plan_equals_the_row_prediction():
    model = EngineCostModel.fit(_synthetic(2000, 2, MIX_KNEE), knee=256)  # 384 - 256 past it
    reqs = [Request(i, 0.0, 1000, 10, 10) for i in range(40)]
    for i, r in enumerate(reqs[:5]):
        r.set_computed(400 + 20 * i)  # the longest decode of the mixed plan: 480
    decode = StepPlan(0, 0.0, tuple(reqs[:37]), (), decode_context_tokens=37 * 500,
                      num_refreshed=37)  # fmt: skip
    preempting = StepPlan(0, 0.0, tuple(reqs[:36]), (), preempted=(reqs[36], reqs[37]),
                          decode_context_tokens=36 * 500)  # fmt: skip
    mixed = StepPlan(
        1, 0.0, tuple(reqs[:5]), ((reqs[5], 300), (reqs[6], 20)), num_prefill_tokens=320,
        decode_context_tokens=2500, prefill_context_tokens=300 + 1020,
        prefill_attention_pairs=300 * 301 // 2 + 20 * 1000 + 20 * 21 // 2, preempted=(reqs[7],),
        longest_decode_context=480,
    )  # fmt: skip
    for plan, row in (
        (decode, [0, 37, 37 * 500, 0, 0, 0, 37, 0, 480, 0]),  # (decode-only: not read)
        (preempting, [0, 36, 36 * 500, 0, 0, 0, 0, 2, 480, 0]),
        (mixed, [320, 5, 2500, 1320, mixed.prefill_attention_pairs, 2, 0, 1, 480, 0]),
    ):
        want = model.predict_rows(np.array([row], dtype=float))[0]
        assert model.step_time(plan) == pytest.approx(want, rel=1e-12)
    # a plan that preempts drains the pipeline: its step costs the fitted drain on top
    plain = StepPlan(0, 0.0, tuple(reqs[:36]), (), decode_context_tokens=36 * 500)
    assert model.step_time(preempting) - model.step_time(plain) == pytest.approx(DEC[-1], rel=1e-5)
    assert model.step_time(StepPlan(2, 0.0, (), ())) == 0.0
    report = model.report()
    assert set(report) == {"decode_only_us", "mixed_us", "knee_tokens"}
    assert report["knee_tokens"] == 256 and "tokens_past_knee" in report["mixed_us"]
    assert report["decode_only_us"]["refreshed"] > 0


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".csv.xz"])
def test_calibration_file_round_trip(tmp_path, suffix):
    rows = _synthetic(300, 3)
    path = tmp_path / f"cal{suffix}"
    write_steps(rows, path, {"gpu": "NVIDIA H200", "buckets": {"max_num_seqs": 256}})
    back, meta = read_steps(path)
    np.testing.assert_allclose(back, rows, rtol=1e-8)
    assert meta["gpu"] == "NVIDIA H200" and (tmp_path / "cal.json").exists()
    a = EngineCostModel.fit(rows)
    b = EngineCostModel.from_file(path)
    np.testing.assert_allclose(a.decode_coef, b.decode_coef, rtol=1e-6)
    write_steps(rows, tmp_path / f"again{suffix}", {})
    assert path.read_bytes() == (tmp_path / f"again{suffix}").read_bytes()  # deterministic
    # the writer's knee is read back as is; without one in the file, the fit searches
    assert a.knee is None and b.knee is None
    write_steps(rows, tmp_path / f"kneed{suffix}", {"knee_tokens": 512})
    assert EngineCostModel.from_file(tmp_path / f"kneed{suffix}").knee == 512


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_steps(tmp_path / "none.csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns"):
        read_steps(tmp_path / "x.csv")
    rows = _synthetic(400, 4)
    with pytest.raises(ValueError, match="mixed steps to fit"):
        EngineCostModel.fit(rows[rows[:, 0] == 0])


def test_step_rows_of_engine_records():
    rec = RunRecords.load_npz(str(GOLDEN / "golden_burst_r800.horizon.npz"))
    rows = step_rows(rec)
    assert rows.shape == (len(rec.step_end), len(STEP_COLUMNS))
    # the log is the pipelined engine's: a step's duration runs from the previous one's end
    assert (rec.step_start[1:] < rec.step_end[:-1]).any()
    np.testing.assert_array_equal(rows[:, -1], rec.step_durations())
    assert (rows[:, -1] < rec.step_end - rec.step_start).any()
    assert rows[:, 6].max() > 0  # horizon's refreshes are in the log
    old = RunRecords(**{**rec.__dict__, "num_refreshed": np.full(len(rec.step_end), -1)})
    with pytest.raises(ValueError, match="plan columns"):
        step_rows(old)


def test_step_noise_is_the_fitted_steps_scatter_and_seeded():
    rows = _synthetic(3000, 5)
    rng = np.random.default_rng(6)
    rows[:, -1] *= rng.lognormal(0.0, 0.05, len(rows))  # measured = model x 5% scatter
    model = EngineCostModel.fit(rows)
    reqs = [Request(i, 0.0, 100, 10, 10) for i in range(8)]
    plan = StepPlan(0, 0.0, tuple(reqs), (), decode_context_tokens=8 * 300)
    base = model.step_time(plan)
    first = model.with_noise(1, block_steps=20).step_time(plan)
    noisy = model.with_noise(1, block_steps=20)
    draws = np.array([noisy.step_time(plan) for _ in range(4000)]) / base
    again = model.with_noise(1, block_steps=20)
    assert [again.step_time(plan) for _ in range(5)] == list(base * draws[:5])  # seeded
    assert first == base * draws[0]
    other = model.with_noise(2, block_steps=20)
    assert [other.step_time(plan) for _ in range(5)] != list(base * draws[:5])
    assert 0.035 < np.std(np.log(draws)) < 0.065  # the scatter that was fitted
    assert abs(np.median(draws) - 1) < 0.02
    # blocks: consecutive decode steps take consecutive measured ratios (slow stretches stay)
    res = model.residuals[0]  # ratios of the fitted decode-only steps, in measured order
    run = model.with_noise(9, block_steps=50)
    seq = np.array([run.step_time(plan) for _ in range(50)]) / base
    start = int(np.argmin(np.abs(res - seq[0])))
    np.testing.assert_allclose(seq, res[start : start + 50])
    with pytest.raises(ValueError, match="block_steps"):
        model.with_noise(0, block_steps=0)
    assert noisy.step_time(StepPlan(1, 0.0, (), ())) == 0.0
    with pytest.raises(ValueError, match="residuals"):
        EngineCostModel(model.decode_coef, model.mixed_coef).with_noise(0)


def test_registry_builds_the_engine_fitted_model_with_and_without_noise(tmp_path):
    from horizon.model_shape import model_shape
    from simulator import make_cost_model
    from simulator.gpu import gpu_spec

    path = tmp_path / "cal.csv.gz"
    write_steps(_synthetic(500, 7), path, {"gpu": "NVIDIA H200", "model": "qwen2.5-0.5b"})
    kw = {"shape": model_shape("qwen2.5-0.5b"), "gpu": gpu_spec("H200"), "path": str(path)}
    assert isinstance(make_cost_model("engine_fitted", **kw), EngineCostModel)
    assert make_cost_model("engine_fitted", noise_seed=3, **kw).seed == 3
    with pytest.raises(ValueError, match="qwen2.5-7b"):
        make_cost_model("engine_fitted", **{**kw, "shape": model_shape("qwen2.5-7b")})


def test_scaled_model_times_every_step_by_the_factor():
    model = EngineCostModel.fit(_synthetic(2000, 4))
    rows = _synthetic(200, 5)
    np.testing.assert_allclose(
        model.scaled(1.01).predict_rows(rows), 1.01 * model.predict_rows(rows), rtol=1e-12
    )
    reqs = [Request(i, 0.0, 100, 10, 10) for i in range(8)]
    plan = StepPlan(0, 0.0, tuple(reqs[:6]), ((reqs[6], 64),), num_prefill_tokens=64,
                    decode_context_tokens=6 * 300, prefill_context_tokens=64,
                    prefill_attention_pairs=64 * 65 // 2, preempted=(reqs[7],))  # fmt: skip
    assert model.scaled(0.99).step_time(plan) == pytest.approx(0.99 * model.step_time(plan))
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="scale factor"):
            model.scaled(bad)


def test_the_longest_decode_is_its_own_term():
    """Steps of one mean context but longer longest decodes cost more, by the fitted term (the
    plan's ``longest_decode_context``, which the scheduler computes: tests/test_scheduler*)."""
    model = EngineCostModel.fit(_synthetic(3000, 8))
    assert model.mixed_coef[-1] == pytest.approx(MIX[-1], rel=1e-5)
    reqs = [Request(i, 0.0, 2000, 10, 10) for i in range(5)]

    def plan(contexts: list[int]) -> StepPlan:
        for r, c in zip(reqs, contexts):
            r.set_computed(c)
        return StepPlan(0, 0.0, tuple(reqs[:4]), ((reqs[4], 64),), num_prefill_tokens=64,
                        decode_context_tokens=sum(contexts[:4]), prefill_context_tokens=64,
                        prefill_attention_pairs=64 * 65 // 2,
                        longest_decode_context=max(contexts[:4]))  # fmt: skip

    even, skewed = (
        model.step_time(plan([500] * 4 + [0])),
        model.step_time(plan([1700, 100, 100, 100, 0])),
    )
    assert skewed - even == pytest.approx(MIX[-1] * 1200, rel=1e-6)


def test_files_without_the_longest_decode_fit_without_it(tmp_path):
    """A calibration file written before the column reads it as -1; its fit has no such term
    (the other terms fitted as before), and a model with the term refuses such rows."""
    rows = _synthetic(2000, 9, MIX[:-1] + (0.0,))
    old = tmp_path / "old.csv"
    header = ",".join(c for c in STEP_COLUMNS if c != "longest_decode_context")
    lines = [",".join(f"{v:.9g}" for v in np.delete(r, 8)) for r in rows]
    old.write_text(header + "\n" + "\n".join(lines) + "\n")
    back, _ = read_steps(old)
    assert back.shape == rows.shape and (back[:, 8] == -1).all()
    np.testing.assert_allclose(np.delete(back, 8, axis=1), np.delete(rows, 8, axis=1), rtol=1e-8)
    fitted = EngineCostModel.fit(back)
    assert fitted.mixed_coef[-1] == 0
    np.testing.assert_allclose(fitted.mixed_coef[:-1], MIX[:-1], rtol=1e-5, atol=1e-12)
    with pytest.raises(ValueError, match="longest_decode_context"):
        EngineCostModel.fit(_synthetic(2000, 8)).predict_rows(back)
    # coefficients stored before the term (12 of them) load without it; others are refused
    short = EngineCostModel(fitted.decode_coef, fitted.mixed_coef[:-1])
    assert short.mixed_coef == fitted.mixed_coef
    with pytest.raises(ValueError, match="mixed_coef"):
        EngineCostModel(fitted.decode_coef, fitted.mixed_coef[:-2])
