"""The headline's pieces: the bisection, the intervals, the summary's choice of the strongest
baseline, the tuning budget and its committed configs, and a tiny end-to-end run."""

from __future__ import annotations

import json
import math

import pytest
from hydra import initialize_config_dir
from PIL import Image

from experiments.config_store import register_configs
from experiments.gain_report import HEADLINE_KEYS, combine, write_report
from experiments.gain_runner import Plan, SeedTask, compose_run, run_tasks
from experiments.gain_settings import ORACLES, SETTINGS, TUNING, rows_of
from experiments.gain_stats import mean_ci, paired_ratio_ci, separated
from experiments.gain_summary import summarise
from experiments.policy_gain import LOAD_FRACTIONS, REPO, measure

PLAN = Plan(num_requests=10, seeds=(0, 1), iterations=8, lo=20.0, hi=200.0)


def test_bisection_finds_the_highest_rate_that_holds_the_target():
    from experiments.gain_runner import bisect_rate

    asked = []

    def goodput(rate: float) -> float:
        asked.append(rate)
        return 1.0 if rate <= 127.3 else 0.4

    r = bisect_rate(goodput, 0.9, PLAN)
    assert r <= 127.3 < r + (PLAN.hi - PLAN.lo) / 2**PLAN.iterations + 0.01
    assert len(asked) == 2 + PLAN.iterations
    assert bisect_rate(lambda _: 0.1, 0.5, PLAN) == PLAN.lo  # nothing holds it
    assert bisect_rate(lambda _: 1.0, 0.5, PLAN) == PLAN.hi  # everything does


def test_the_load_bisection_refines_past_a_cliff_until_near_the_target():
    from experiments.gain_runner import bisect_rate

    plan = Plan(num_requests=10, seeds=(0,), iterations=8, lo=20.0, hi=200.0, refine=6)

    def goodput(rate: float) -> float:
        if rate > 59.43:
            return 0.2
        return 0.5 + 0.12 * min(1.0, (59.43 - rate) / 0.1)

    coarse = bisect_rate(goodput, 0.5, plan)
    fine = bisect_rate(goodput, 0.5, plan, tolerance=0.03)
    assert goodput(coarse) > 0.53
    assert 0.5 <= goodput(fine) <= 0.53 and coarse <= fine <= 59.43


def test_t_intervals_over_seeds():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    half = 4.302653 / math.sqrt(3)  # t(0.975, 2) * sd 1 / sqrt(3)
    assert m == 2.0 and lo == pytest.approx(2 - half, rel=1e-5) and hi == pytest.approx(2 + half)
    assert mean_ci([5.0]) == (5.0, 5.0, 5.0)
    r = paired_ratio_ci([2.0, 3.0], [1.0, 1.5])  # both seeds exactly 2x
    assert r == pytest.approx((2.0, 2.0, 2.0))
    assert separated((3, 2.5, 3.5), (2, 1.5, 2.4)) and not separated((3, 2.5, 3.5), (2, 1.5, 2.6))
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])


def _synthetic():
    rate90 = {  # per seed; the oracle row is the best and must not count as a baseline
        "fcfs": [50.0, 52.0, 54.0],
        "sglang": [60.0, 61.0, 62.0],
        "horizon_mean": [64.0, 66.0, 65.0],
        "horizon_learned": [72.0, 73.2, 74.4],
        "horizon_oracle": [90.0, 91.0, 92.0],
    }
    goodput = {  # two loads: sglang best at the first, fcfs at the second
        "fcfs": [[0.9, 0.9, 0.9], [0.5, 0.6, 0.7]],
        "sglang": [[1.0, 1.0, 1.0], [0.4, 0.4, 0.4]],
        "horizon_mean": [[1.0, 1.0, 1.0], [0.8, 0.8, 0.8]],
        "horizon_learned": [[1.0, 1.0, 1.0], [0.9, 1.2, 1.4]],
        "horizon_oracle": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
    }
    return rate90, {"goodput_lifetime": goodput}


def test_the_strongest_baseline_is_neither_horizon_nor_an_oracle():
    rate90, at_load = _synthetic()
    s = summarise("poisson", rate90, (60.0, 80.0), at_load, {}, 10, 1.0)
    assert s["strongest_baseline"] == "sglang"
    assert s["gain_vs_strongest"] == pytest.approx(73.2 / 61.0, abs=1e-3)
    assert s["gain_vs_strongest_paired"]["mean"] == pytest.approx(1.2, abs=1e-3)
    assert s["gain_vs_strongest_separated"] is True
    assert s["learned_vs_mean"] == pytest.approx(73.2 / 65.0, abs=1e-3)
    assert s["strongest_at_load"] == ["sglang", "fcfs"]
    # per seed 0.9/0.5, 1.2/0.6, 1.4/0.7 = 1.8, 2, 2
    assert s["goodput_vs_strongest_at_load"][1]["mean"] == pytest.approx(5.8 / 3, abs=1e-3)
    assert s["learned_vs_mean_at_load"][1]["mean"] == pytest.approx(3.5 / 0.8 / 3, abs=1e-3)
    assert s["goodput_seeds"]["fcfs"][1] == [0.5, 0.6, 0.7]
    lo, hi = s["rate_at_90_ci"]["fcfs"]
    assert lo < s["rate_at_90"]["fcfs"] == 52.0 < hi
    assert set(ORACLES) & set(rows_of("poisson")) == set(ORACLES)


def test_every_knobbed_policy_gets_the_same_budget_and_its_default_first():
    sizes = {name: len(grid) for name, (_, grid) in TUNING.items()}
    assert len(set(sizes.values())) == 1, sizes
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for name, (base, grid) in TUNING.items():
            shipped = compose_run([f"policy={base}"]).policy.options
            first = compose_run([f"policy={base}", *grid[0]]).policy.options
            assert first == shipped, name  # the shipped default is one of the candidates
            assert len({tuple(c) for c in grid}) == len(grid), name


def test_the_committed_tuned_configs_are_what_the_tuning_chose():
    doc = json.loads((REPO / "results" / "policy_gain" / "tuning.json").read_text())
    assert set(doc["policies"]) == set(TUNING)
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for name, entry in doc["policies"].items():
            best = max(c["rate_at_90"] for c in entry["candidates"])
            chosen = [c for c in entry["candidates"] if c["overrides"] == entry["chosen"]]
            assert chosen and chosen[0]["rate_at_90"] == best, name
            want = compose_run([f"policy={entry['base']}", *entry["chosen"]]).policy
            assert compose_run([f"policy=tuned/{name}"]).policy == want, name


def test_every_row_of_every_setting_composes():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for setting, common in SETTINGS.items():
            for row, overrides in rows_of(setting).items():
                cfg = compose_run([*common, *overrides])
                assert cfg.model.num_blocks == 3000 and cfg.slo.name == "h200_7b", row


def test_a_tiny_headline_end_to_end(tmp_path):
    plan = Plan(num_requests=40, seeds=(0, 1), iterations=2, lo=10.0, hi=170.0)
    s = measure("poisson", plan, 1, [], only=("fcfs", "horizon_oracle"))
    assert len(s["loads"]) == len(LOAD_FRACTIONS) and s["strongest_baseline"] == "fcfs"
    best = max(s["rate_at_90"].values())
    assert s["loads"][-1] == pytest.approx(1.3 * best, abs=0.06)
    for row, seeds in s["rate_at_90_seeds"].items():
        assert len(seeds) == 2 and all(plan.lo <= r <= plan.hi for r in seeds), row
        lo, hi = s["rate_at_90_ci"][row]
        assert lo <= s["rate_at_90"][row] <= hi
    for per in s["at_load"]["goodput_lifetime"].values():
        assert all(0 <= v["mean"] <= 1 and v["ci"][0] <= v["mean"] <= v["ci"][1] for v in per)
    (tmp_path / "settings").mkdir()
    (tmp_path / "settings" / "poisson.json").write_text(json.dumps(s))
    combined = write_report(tmp_path)
    doc = json.loads((tmp_path / "policy_gain.json").read_text())
    assert set(HEADLINE_KEYS) <= set(doc) and doc["strongest_baseline"] == "fcfs"
    assert combined == combine(tmp_path)
    with Image.open(tmp_path / "goodput_vs_load.png") as img:  # a drawn figure, not a blank
        colours = img.convert("RGB").getcolors(1 << 16)
    assert img.width > 800 and len(colours) > 16
    assert "| fcfs |" in (tmp_path / "policy_gain.md").read_text()


def test_workers_give_the_same_figures_as_one_process():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose_run([*SETTINGS["poisson"], "policy=fcfs"])
    plan = Plan(num_requests=40, seeds=(0,), iterations=1, lo=10.0, hi=170.0)
    tasks = [SeedTask("fcfs", cfg, s, plan, loads=(80.0, 200.0)) for s in (0, 1, 2)]
    one, two = run_tasks(tasks, 1), run_tasks(tasks, 2)
    assert [r.at for r in one] == [r.at for r in two]
    assert one[0].at != one[1].at  # seeds differ


def test_learned_rows_run_first_and_results_keep_the_tasks_order(monkeypatch):
    import experiments.gain_runner as gr

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        fcfs, horizon = compose_run(["policy=fcfs"]), compose_run(["policy=horizon"])
    ran = []

    def fake(task, sources=None):  # noqa: ANN001, ANN202
        ran.append(task.row)
        return gr.SeedResult(task.row, task.seed, 1.0, {}, 0)

    monkeypatch.setattr(gr, "run_task", fake)
    monkeypatch.setattr(gr, "DataSources", lambda data: None)
    tasks = [SeedTask(r, c, 0, PLAN) for r, c in (("a", fcfs), ("b", horizon), ("c", fcfs))]
    assert [r.row for r in run_tasks(tasks, 1)] == ["a", "b", "c"]
    assert ran == ["b", "a", "c"]
