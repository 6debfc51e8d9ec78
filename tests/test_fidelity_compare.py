"""``experiments.fidelity compare`` end to end on the golden engine logs (tests/data/golden):
one golden case plays the calibration runs, the other the compared runs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from experiments.compact_json import rounded
from experiments.fidelity_compare import METRICS, REPORT_DIGITS, compare, engine_pipelined
from experiments.fidelity_manifest import Case, Manifest
from experiments.fidelity_ranking import rank_pairs as _rank_pairs
from experiments.fidelity_ranking import same_ranking as _same_ranking

GOLDEN = Path(__file__).parent / "data" / "golden"


def _engine_dir(tmp_path: Path) -> Path:
    """The golden logs as engine runs: one case plays the calibration, the other the compared."""
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


@pytest.fixture()
def engine_dir(tmp_path):
    return _engine_dir(tmp_path)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    """One comparison with the golden runs as their own repeat: (folder, result)."""
    d = _engine_dir(tmp_path_factory.mktemp("repeated"))
    runs = str(d / "runs")
    result = compare(
        runs, str(d / "manifest.json"), str(d / "report"),
        calibration_out=d / "cal.csv.gz", repeat_dir=runs,
    )  # fmt: skip
    return d, result


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


def test_a_repeat_of_the_engine_is_compared_with_the_first_run(repeated):
    engine_dir, result = repeated
    assert result["engine_repeat_goodput_diff_pts"] == 0.0  # the same runs: no difference
    assert set(result["engine_repeat_errors"].values()) == {0.0}
    assert result["engine_repeat_ranking_identical"] is True
    assert result["ranking_identical_vs_repeat"] == result["ranking_identical"]
    assert result["engine_repeat_in_sim_band"] == result["engine_goodput_in_sim_band"]
    assert "engine / engine again / sim" in (engine_dir / "report" / "README.md").read_text()


def test_the_report_json_holds_every_figure_with_its_conditions(repeated):
    d, result = repeated
    out = d / "report"
    doc = json.loads((out / "report.json").read_text())
    assert doc["format"] == "horizon-fidelity-report" and doc["version"] == 1
    assert doc["headline"] == rounded(json.loads(json.dumps(result)), REPORT_DIGITS)
    assert doc["headline"]["goodput_err_pts"] == pytest.approx(result["goodput_err_pts"], rel=1e-7)
    c = doc["conditions"]
    m = Manifest.load(d / "manifest.json")
    assert (c["model"], c["gpu"], c["torch"]) == ("qwen2.5-0.5b", "NVIDIA H200", "2.11.0+cu130")
    assert c["slo"] == {"ttft_s": m.ttft_slo, "itl_s": m.itl_slo, "preset": "h200_0.5b",
                        "goodput": "lifetime"}  # fmt: skip
    assert c["scheduler"] == m.scheduler and c["noise_seeds"] == list(range(10))
    assert c["engine"] == {"dir": str(d / "runs"), "repeat_dir": str(d / "runs"),
                           "loop": "pipelined", "dates": ["2026-11-29"], "commits": []}  # fmt: skip
    cases = {x["name"]: x for x in c["cases"]}
    assert cases["golden_burst_r800"] == {
        "name": "golden_burst_r800", "role": "fidelity", "workload": "sharegpt_first_turn",
        "rate": 800.0, "seed": 3, "requests": 120, "max_time_s": m.cases[1].max_time,
        "policies": ["fcfs", "horizon"],
    }  # fmt: skip
    assert cases["golden_first_r40"]["role"] == "calibration"
    # the runs are table.csv's rows, the step errors steps_mape.json
    with open(out / "table.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["policy"]) for r in rows] == [
        (r["case"], r["policy"]) for r in doc["runs"]
    ]
    for r, j in zip(rows, doc["runs"]):
        assert list(r) == list(j)
        assert float(r["ttft_p99_err"]) == pytest.approx(j["ttft_p99_err"], rel=1e-5)
    assert doc["step_mape"] == json.loads((out / "steps_mape.json").read_text())
    assert doc["met"]["goodput_err_pts"] == (result["goodput_err_pts"] <= 2.0)
    assert doc["met"]["ttft_p99_err"] == (result["ttft_p99_err"] <= 0.05)
    within = doc["within_target"]
    assert within["runs"] == 2
    assert within["figures"]["goodput_err_pts"]["deterministic"] == sum(
        r["goodput_err_pts"] <= 2.0 for r in doc["runs"]
    )
    assert 0 <= within["figures"]["itl_p99_err"]["with_scatter"] <= 2
    ranking = doc["ranking"]["golden_burst_r800"]
    assert ranking["identical"] == result["ranking_identical"]
    assert ranking["engine_vs_engine_again"] is True  # the repeat is the same runs
    g = ranking["goodput"]["horizon"]
    assert g["engine"] == g["engine_again"] == doc["runs"][1]["goodput_lifetime_engine"]
    assert len(doc["repeat"]) == 2 and doc["plots"] == ["sharegpt_first_turn.png"]


def _scaled(x, f: float):  # noqa: ANN001, ANN202
    """``x`` with every float (not int or bool) times ``f``."""
    if isinstance(x, dict):
        return {k: _scaled(v, f) for k, v in x.items()}
    if isinstance(x, list):
        return [_scaled(v, f) for v in x]
    return x * f if isinstance(x, float) else x


def test_the_page_renders_the_json_and_no_sentence_depends_on_a_figure(repeated, tmp_path):
    from experiments.fidelity_page import write_page

    d, _ = repeated
    doc = json.loads((d / "report" / "report.json").read_text())
    page = write_page(doc, tmp_path / "a.md")
    r = doc["runs"][0]
    assert f"| {r['case']} | {r['policy']} | {r['goodput_lifetime_engine']:.3f} / " in page
    assert f"{100 * doc['headline']['step_mape']:.2f}%" in page
    assert "TTFT ≤ 0.25 s and every ITL ≤ 10 ms" in page and "golden_burst_r800" in page
    # every figure halved: the tables change, no line of prose does
    figures = ("headline", "runs", "step_mape", "cost_model", "within_target", "repeat")
    other = {**doc, **{k: _scaled(doc[k], 0.5) for k in figures}}
    half = write_page(other, tmp_path / "b.md")
    assert half != page

    def prose(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith(("|", "- "))]

    assert prose(half) == prose(page)


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

    from experiments.fidelity_cost_models import pre_refresh as _pre_refresh
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


def test_engine_runs_of_other_requests_are_refused():
    """Requests rebuilt by other code or settings (here one prompt a token longer) are not
    those the engine ran, though every arrival time is the same."""
    from experiments.fidelity_compare import check_same_requests
    from horizon.metrics.records import RunRecords
    from horizon.workload.requests_file import load_requests

    m = Manifest.load(GOLDEN / "manifest.json")
    case = m.of_role("golden")[1]
    rec = RunRecords.load_npz(str(GOLDEN / f"{case.name}.fcfs.npz"))
    requests = load_requests(GOLDEN / case.requests)
    check_same_requests(rec, requests, case.name)  # the requests it ran
    requests[5].num_prompt_tokens += 1
    with pytest.raises(ValueError, match=f"case {case.name}: the engine run's requests"):
        check_same_requests(rec, requests, case.name)
    with pytest.raises(ValueError, match="not the manifest's"):
        check_same_requests(rec, load_requests(GOLDEN / case.requests)[:-1], case.name)
