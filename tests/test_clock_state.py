"""The clock state: the duty cycle's curve, the hot share over measured and over priced steps,
and a fit that takes the slowdown out of its steps."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation
from simulator import clock_state as cs
from simulator.clock_state import ClockStateCost, ClockTable, heat
from simulator.engine_cost_model import Buckets
from simulator.physical_cost_model import PhysicalCostModel
from tests.test_physical_cost_model import TFLOPS, TRUE, _steps

H7B = "results/duty_cycle/h200_qwen2.5-7b.json"
H05B = "results/duty_cycle/h200_qwen2.5-0.5b.json"


def _plan(prefill: int, decodes: int = 4):
    return SimpleNamespace(decodes=tuple(range(decodes)), prefills=((0, prefill),) * (prefill > 0),
                           num_prefill_tokens=prefill, is_empty=prefill + decodes == 0,
                           prefill_attention_pairs=prefill * prefill // 2,
                           decode_context_tokens=400 * decodes, prefill_context_tokens=prefill,
                           num_refreshed=0, preempted=())  # fmt: skip


class _Fixed:
    """A base cost model: 40 ms for a step of >= 1,024 tokens, 5 ms for any other."""

    max_num_seqs = 256

    def __init__(self, k: float = 1.0) -> None:
        self.k = k

    def scaled(self, factor: float) -> _Fixed:
        return _Fixed(self.k * factor)

    def step_time(self, plan) -> float:  # noqa: ANN001
        if plan.is_empty:
            return 0.0
        return self.k * (0.040 if plan.num_prefill_tokens + len(plan.decodes) >= 1024 else 0.005)


def test_the_7b_duty_cycle_gives_its_measured_slowdowns_and_the_05b_none():
    rows = json.loads(Path(H7B).read_text())["rows"]
    gap0 = next(r for r in rows if r["gap"] == 0)
    gap128 = next(r for r in rows if r["gap"] == 128)
    t = ClockTable.from_duty_cycle(H7B)
    assert t.shares[-1] == pytest.approx(1.0) and t.shares[0] < 0.1
    assert t.mixed[-1] == pytest.approx(gap0["full_ms"] / gap128["full_ms"] - 1)
    assert 0.09 < t.mixed[-1] < 0.11 and 0.06 < t.decode[-1] < 0.09
    assert t.mixed[0] == t.decode[0] == 0.0  # the isolated gap is the reference
    assert all(np.diff(t.mixed) >= 0) and all(np.diff(t.decode) >= 0)
    assert not t.is_flat and ClockTable.from_duty_cycle(H05B).is_flat  # 1,980 MHz throughout
    assert float(t.slowdown(0.5, True)) == pytest.approx(np.interp(0.5, t.shares, t.mixed))


def test_a_malformed_duty_cycle_file_or_table_is_refused_by_name(tmp_path):
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps({"rows": [{"gap": 0, "full_ms": 4.0}]}))
    with pytest.raises(ValueError, match="d.json"):
        ClockTable.from_duty_cycle(bad)
    with pytest.raises(ValueError, match="ClockTable.mixed"):
        ClockTable((0.0, 1.0), (0.1, 0.0), (0.0, 0.0))
    with pytest.raises(ValueError, match="ClockTable.shares"):
        ClockTable((0.5, 0.2), (0.0, 0.1), (0.0, 0.0))


def test_the_share_over_priced_steps_is_the_share_heat_computes_over_measured_ones():
    table = ClockTable.from_duty_cycle(H7B)
    cost = ClockStateCost(_Fixed(), table)
    rng = np.random.default_rng(0)
    plans = [_plan(int(p)) for p in rng.choice([0, 0, 0, 64, 2048], 400)]
    shares, rows = [], []
    for plan in plans:
        shares.append(cost.share())
        t = cost.step_time(plan)
        cost.check_integrity()
        rows.append([plan.num_prefill_tokens, len(plan.decodes), 0, 0, 0, 0, 0, 0, t])
    assert np.allclose(heat(np.array(rows), table), shares, atol=1e-9)
    assert min(shares) == 0.0 and 0.5 < max(shares) <= 1.0 + 1e-12


def test_back_to_back_full_steps_run_slower_by_the_table_and_isolated_ones_do_not():
    table = ClockTable.from_duty_cycle(H7B)
    cost = ClockStateCost(_Fixed(), table)
    assert cost.step_time(_plan(2048)) == pytest.approx(0.040)  # a cold GPU
    for _ in range(10):
        t = cost.step_time(_plan(2048))
    assert t == pytest.approx(0.040 * (1 + table.mixed[-1]))
    assert cost.step_time(_plan(0)) == pytest.approx(0.005 * (1 + table.decode[-1]))
    for _ in range(200):
        cost.step_time(_plan(0))
    assert cost.share() == 0.0 and cost.step_time(_plan(2048)) == pytest.approx(0.040)
    fresh = cost.scaled(2.0)
    assert fresh.share() == 0.0 and fresh.step_time(_plan(2048)) == pytest.approx(0.080)


def _throttled(rows: np.ndarray, table: ClockTable, base: PhysicalCostModel) -> np.ndarray:
    """``rows`` timed by ``base`` with the table's slowdown: the fixed point of durations and
    the share they give (the slowdown is small, so a few rounds settle it)."""
    rows = rows.copy()
    t0 = base.predict_rows(rows)
    rows[:, -1] = t0
    for _ in range(8):
        rows[:, -1] = t0 * (1 + table.slowdown(heat(rows, table), rows[:, 0] > 0))
    return rows


def test_the_fit_takes_the_slowdown_out_and_prices_hot_and_cold_runs_alike():
    table = ClockTable.from_duty_cycle(H7B)
    true = PhysicalCostModel(TRUE, 57344, Buckets(), TFLOPS)
    rng = np.random.default_rng(3)
    runs = [_throttled(_steps(rng, 600, max_prefill=mp), table, true) for mp in (2048, 512, 2048)]
    runs = [r[(r[:, 0] + r[:, 1]) > 0] for r in runs]
    fit = cs.fit(runs, table, "qwen2.5-7b")
    plain = PhysicalCostModel.fit(np.concatenate(runs), model="qwen2.5-7b")
    full = [2048, 0, 0, 2048, 2048 * 2049 / 2, 1, 0, 0, 0]  # one 2,048-token chunk
    hot = _throttled(np.tile(full, (50, 1)), table, true)  # back to back
    for rows in (*runs, hot):
        err = np.abs(fit.predict_rows(rows) / rows[:, -1] - 1)
        assert err.mean() < 0.01
    plain_hot = plain.predict_rows(hot).sum() / hot[:, -1].sum() - 1
    fit_hot = fit.predict_rows(hot).sum() / hot[:, -1].sum() - 1
    assert abs(fit_hot) < 0.01 < abs(plain_hot)


def test_a_simulated_run_with_the_clock_state_finishes_the_same_requests_later():
    rng = np.random.default_rng(1)
    shapes = [(int(rng.integers(900, 2000)), int(rng.integers(5, 60))) for _ in range(60)]
    base = PhysicalCostModel(TRUE, 57344, Buckets(), TFLOPS)
    table = ClockTable.from_duty_cycle(H7B)

    def run(cost):  # noqa: ANN001, ANN202
        reqs = [Request(i, 0.02 * i, p, 300, o) for i, (p, o) in enumerate(shapes)]
        return Simulation(reqs, SchedulerConfig(num_blocks=2000), make_policy("fcfs"), cost).run()

    plain, hot = run(base), run(ClockStateCost(base, table))
    assert (plain.status == hot.status).all()
    assert hot.step_durations().sum() > 1.01 * plain.step_durations().sum()
    flat = run(ClockStateCost(base, ClockTable.from_duty_cycle(H05B)))
    assert np.allclose(flat.step_durations(), plain.step_durations())


def test_the_scalar_interpolation_is_numpys():
    table = ClockTable.from_duty_cycle(H7B)
    for x in [-0.1, 0.0, *np.random.default_rng(2).uniform(0, 1, 200), *table.shares, 1.0, 1.3]:
        for col in (table.mixed, table.decode):
            assert cs._interp(float(x), table.shares, col) == pytest.approx(
                float(np.interp(x, table.shares, col)), abs=1e-15
            )


def test_each_backend_takes_its_own_clock_state_so_a_rerun_repeats_itself():
    rng = np.random.default_rng(1)
    shapes = [(int(rng.integers(900, 2000)), int(rng.integers(5, 60))) for _ in range(40)]
    cost = ClockStateCost(
        PhysicalCostModel(TRUE, 57344, Buckets(), TFLOPS), cs.ClockTable.from_duty_cycle(H7B)
    )

    def run():  # noqa: ANN202
        reqs = [Request(i, 0.02 * i, p, 300, o) for i, (p, o) in enumerate(shapes)]
        sim = Simulation(reqs, SchedulerConfig(num_blocks=2000), make_policy("fcfs"), cost,
                         check_every=1)  # fmt: skip
        return sim.run()

    first, second = run(), run()
    assert np.array_equal(first.step_durations(), second.step_durations())
    assert cost.share() == 0.0  # the object passed in priced nothing: each run had a fresh one
    fresh = cost.fresh()
    assert fresh is not cost and fresh.base is cost.base and fresh.table is cost.table
