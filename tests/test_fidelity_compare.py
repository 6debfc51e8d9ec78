"""``experiments.fidelity compare`` end to end on the golden engine logs (tests/data/golden):
one golden case plays the calibration runs, the other the compared runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.fidelity_compare import (
    METRICS,
    _rank_pairs,
    _same_ranking,
    compare,
    engine_pipelined,
)
from experiments.fidelity_manifest import Case, Manifest

GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.fixture()
def engine_dir(tmp_path):
    m = Manifest.load(GOLDEN / "manifest.json")
    cases = []
    for c, role in zip(m.of_role("golden"), ("calibration", "fidelity")):
        cases.append(Case(**{**c.__dict__, "role": role}))
        shutil.copy(GOLDEN / c.requests, tmp_path / c.requests)
        for p in c.policies:
            d = tmp_path / "runs" / c.name / p
            d.mkdir(parents=True)
            shutil.copy(GOLDEN / f"{c.name}.{p}.npz", d / "records.npz")
            shutil.copy(GOLDEN / f"{c.name}.{p}.meta.json", d / "meta.json")
    Manifest(**{**m.__dict__, "cases": tuple(cases)}).save(tmp_path / "manifest.json")
    return tmp_path


def test_compare_reports_every_figure(engine_dir, capsys):
    out = engine_dir / "report"
    result = compare(
        str(engine_dir / "runs"), str(engine_dir / "manifest.json"), str(out),
        calibration_out=engine_dir / "cal.csv.gz",
    )  # fmt: skip
    last = capsys.readouterr().out.strip().splitlines()[-1]
    printed = json.loads(last)
    noise = printed.pop("with_step_noise")
    bias = printed.pop("one_percent_sensitivity")
    assert bias == pytest.approx(result.pop("one_percent_sensitivity"))
    assert set(bias) == {"goodput_err_pts", *(f"{k}_err" for k in METRICS)}
    # every step 1% longer or shorter: requests end about 1-2% later or sooner (queueing in
    # the burst adds to the step's own share)
    assert 0.005 < bias["e2e_mean_err"] < 0.05 and all(v >= 0 for v in bias.values())
    inside, total = (int(v) for v in printed.pop("engine_goodput_in_sim_band").split("/"))
    assert total == 2 and 0 <= inside <= 2
    assert result.pop("engine_goodput_in_sim_band") == f"{inside}/{total}"
    assert printed == pytest.approx({k: v for k, v in result.items() if k != "with_step_noise"})
    assert noise == pytest.approx(result["with_step_noise"])
    assert set(noise) == {"goodput_err_pts", *(f"{k}_err" for k in METRICS)}
    want = {"step_mape", "goodput_err_pts", "ranking_identical", *(f"{k}_err" for k in METRICS)}
    assert want <= set(result)
    assert 0 < result["step_mape"] < 0.5  # one light run fits the other within 50%
    assert 0 <= result["goodput_err_pts"] <= 100
    page = (out / "README.md").read_text()
    assert "NVIDIA H200" in page and "golden_burst_r800" in page and "roofline" in page
    assert (out / "table.csv").exists() and (out / "sharegpt_first_turn.png").exists()
    assert (engine_dir / "cal.csv.gz").exists() and (engine_dir / "cal.json").exists()


def test_a_repeat_of_the_engine_is_compared_with_the_first_run(engine_dir):
    runs = str(engine_dir / "runs")
    result = compare(
        runs, str(engine_dir / "manifest.json"), str(engine_dir / "report"),
        calibration_out=engine_dir / "cal.csv.gz", repeat_dir=runs,
    )  # fmt: skip
    assert result["engine_repeat_goodput_diff_pts"] == 0.0  # the same runs: no difference
    assert set(result["engine_repeat_errors"].values()) == {0.0}
    assert result["engine_repeat_ranking_identical"] is True
    assert result["ranking_identical_vs_repeat"] == result["ranking_identical"]
    assert result["engine_repeat_in_sim_band"] == result["engine_goodput_in_sim_band"]
    assert "engine / engine again / sim" in (engine_dir / "report" / "README.md").read_text()


def test_ranking_orders_pairs_alike_and_ties_only_where_both_sides_are_near():
    def same(x: dict[str, float], y: dict[str, float]) -> bool:
        return _same_ranking(_rank_pairs(x), _rank_pairs(y))

    eng = {"fcfs": 0.955, "horizon": 0.967, "memory_first": 0.048}
    assert _rank_pairs(eng)[("fcfs", "horizon")] == pytest.approx(-1.2)
    # one gap measured as 1.2 and 0.9 points: the same order on both sides
    assert same(eng, {"fcfs": 0.953, "horizon": 0.962, "memory_first": 0.048})
    # reversed, and beyond the band on one side: a different ranking
    assert not same(eng, {"fcfs": 0.962, "horizon": 0.960, "memory_first": 0.048})
    # an exact tie against a lean within the band: a tie on both sides
    top = {"fcfs": 1.0, "horizon": 1.0, "memory_first": 0.2}
    assert same(top, {"fcfs": 1.0, "horizon": 0.993, "memory_first": 0.2})
    # an exact tie against a gap beyond the band: different
    assert not same(top, {"fcfs": 1.0, "horizon": 0.985, "memory_first": 0.2})
    # memory_first above fcfs on one side only
    assert not same(top, {"fcfs": 0.15, "horizon": 1.0, "memory_first": 0.2})
    with pytest.raises(ValueError, match="different policies"):
        same(top, {"fcfs": 1.0, "horizon": 1.0})


def test_runs_are_simulated_with_the_engine_loop_they_ran():
    """Engine meta from before ``async_steps`` ran serially; after it, pipelined unless turned
    off or stopping at end-of-sequence."""
    assert not engine_pipelined({"stop": "trace"})  # an old run
    assert engine_pipelined({"stop": "trace", "async_steps": None})
    assert not engine_pipelined({"stop": "eos", "async_steps": None})
    assert not engine_pipelined({"stop": "trace", "async_steps": False})
    assert engine_pipelined({"stop": "trace", "async_steps": True})


def test_pre_refresh_ratio_reads_the_step_before_each_refresh():
    import numpy as np

    from experiments.fidelity_compare import _pre_refresh
    from horizon.metrics.records import RunRecords

    golden = GOLDEN
    rec = RunRecords.load_npz(str(golden / "golden_burst_r800.horizon.npz"))
    before = np.zeros(len(rec.step_end), dtype=bool)
    before[:-1] = rec.num_refreshed[1:] > 0

    from simulator.engine_cost_model import step_rows

    rows = step_rows(rec)
    # modelled time: the measured one, halved on the steps before a refresh
    modelled = np.where(before, rows[:, -1] / 2, rows[:, -1])
    pre, other, n = _pre_refresh(rec.num_refreshed, rows, modelled)
    assert pre == pytest.approx(2.0) and other == pytest.approx(1.0)
    decode = (rec.prefill_tokens == 0) & (rec.decode_tokens > 0)
    assert n == int((before & decode).sum()) > 0
    fcfs = RunRecords.load_npz(str(golden / "golden_burst_r800.fcfs.npz"))
    fcfs_rows = step_rows(fcfs)
    assert _pre_refresh(fcfs.num_refreshed, fcfs_rows, fcfs_rows[:, -1]) is None  # no refreshes


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b"])
def test_each_shape_preset_calibrates_across_its_fidelity_loads(model):
    from experiments.fidelity import preset

    p = preset(model)
    assert p.model == model
    names = [c[0] for c in p.cases]
    assert len(names) == len(set(names))
    for workload in ("sharegpt_first_turn", "sharegpt_multi_turn"):
        cal = [c[3] for c in p.cases if c[1] == "calibration" and c[2] == workload]
        fid = [c[3] for c in p.cases if c[1] == "fidelity" and c[2] == workload]
        assert len(fid) >= 3 and cal and min(cal) < max(fid)
        assert {c[4] for c in p.cases if c[1] == "calibration"}.isdisjoint(
            {c[4] for c in p.cases if c[1] == "fidelity"}
        )  # other seeds


def test_an_unknown_shape_is_named():
    from experiments.fidelity import preset

    with pytest.raises(ValueError, match="no fidelity preset for model 'qwen9'"):
        preset("qwen9")
