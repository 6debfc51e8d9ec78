"""Leave-one-workload-out's lease offset, probe repeatability and per-workload verdicts."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from experiments.lowo import lease_offsets
from experiments.lowo_runs import Run, Source, is_workload
from experiments.lowo_table import summaries, table
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation
from simulator.engine_cost_model import Buckets
from simulator.physical_cost_model import PhysicalCostModel
from tests.test_physical_cost_model import TRUE

# the 7B shape's KV bytes per token; no compute side (tflops 0): a light load, where a 2% slower
# lease moves the mean ITL by about 2%
MODEL = PhysicalCostModel(TRUE, 57344, Buckets())


def _requests(seed: int, n: int = 80, at_zero: bool = False) -> list[Request]:
    import numpy as np

    rng = np.random.default_rng(seed)
    times = np.zeros(n) if at_zero else np.cumsum(rng.exponential(1 / 30.0, n))
    return [
        Request(i, float(t), int(rng.integers(20, 1200)), 300, int(rng.integers(5, 200)))
        for i, t in enumerate(times)
    ]


def _records(requests, scale: float = 1.0):
    return Simulation(requests, SchedulerConfig(num_blocks=800), make_policy("fcfs"),
                      MODEL.scaled(scale)).run()  # fmt: skip


def test_the_anchor_gives_the_lease_offset_and_the_probe_its_repeatability():
    old, new = Source("committed", "fidelity"), Source("lease_b", "lowo")
    runs = [Run(old, f"first_r{k}", "fcfs", _records(_requests(k))) for k in (10, 20, 30)]
    runs += [
        Run(new, "anchor_first_r30", "fcfs", _records(_requests(30), 1.03)),  # 3% slower lease
        Run(new, "probe_0", "fcfs", _records(_requests(7, at_zero=True))),
        Run(new, "probe_1", "fcfs", _records(_requests(7, at_zero=True), 1.01)),
        Run(new, "longout_r12", "fcfs", _records(_requests(12))),
    ]
    got = lease_offsets(runs, "qwen2.5-7b")
    assert got["committed"]["offset"] == 1.0 and got["committed"]["anchor"] is None
    assert got["lease_b"]["anchor"] == "anchor_first_r30/fcfs"
    assert got["lease_b"]["offset"] == pytest.approx(1.03, rel=2e-3)
    assert got["lease_b"]["probe_repeat"] == pytest.approx(0.01, abs=1e-9)
    assert got["lease_b"]["probe_same_plans"]  # all at t = 0: the same plans on any lease
    assert [r.workload for r in runs if is_workload(r)] == ["first"] * 3 + ["longout"]


def _run(policy, goodput_eng, goodput_sim, itl, cliff):
    row = {"model": "m", "source": "s", "case": "w_r1", "policy": policy, "workload": "w",
           "goodput_measured": goodput_eng, "cliff_pts": cliff, "on_cliff": cliff > 3}  # fmt: skip
    for cm in ("engine", "physical"):
        row |= {f"goodput_sim_{cm}": goodput_sim, f"itl_mean_err_{cm}": itl,
                f"goodput_err_pts_{cm}": 100 * (goodput_sim - goodput_eng),
                f"e2e_mean_err_{cm}": 0.01, f"ttft_mean_err_{cm}": 0.0}  # fmt: skip
    return row


def test_a_workloads_verdict_counts_goodput_off_the_cliff_only_and_names_what_is_missed():
    doc = {
        "command": "python -m experiments.lowo",
        "targets": {"bias": 0.015, "mape": 0.03, "itl_mean": 0.03, "e2e_mean": 0.03,
                    "goodput_pts": 2.0},
        "steps": [{"model": "m", "held_out": "w", "cost_model": "physical", "bias": 0.01,
                   "bias_raw": 0.02, "mape": 0.025, "steps": 100}],
        "runs": [_run("fcfs", 0.92, 0.60, 0.04, 9.0), _run("horizon", 0.90, 0.91, -0.01, 0.5)],
        "leases": {},
    }  # fmt: skip
    (row,) = summaries(doc)
    assert row["goodput_pts"] == pytest.approx(1.0)  # the cliff run's 20 points do not count
    assert row["on_cliff"] == 1 and row["itl_mean"] == pytest.approx(0.04)
    assert row["met"] == {"bias": True, "mape": True, "itl_mean": False, "e2e_mean": True,
                          "goodput_pts": True}  # fmt: skip
    assert (row["ranking_same"], row["ranking_cases"]) == (
        0,
        1,
    )  # fcfs ahead on the engine, behind on the sim
    assert "| itl_mean, ranking |" in table(doc)


def test_a_run_resimulated_with_the_lease_offset_matches_a_lease_that_much_slower(tmp_path):
    from experiments.fidelity import POLICIES
    from experiments.fidelity_compare import simulate_engine_loop
    from experiments.fidelity_manifest import Case, Manifest
    from experiments.lowo_runs import compare_run
    from horizon.workload.requests_file import save_requests

    requests = _requests(3, n=150)
    save_requests(requests, tmp_path / "w_r30.json")
    case = Case("w_r30", "fidelity", "w", 30.0, 0, "w_r30.json", ("fcfs",), 20.0)
    m = Manifest("qwen2.5-7b", {"num_blocks": 800}, 1.0, 0.05, dict(POLICIES), (case,))
    m.save(tmp_path / "manifest.json")
    engine = {"async_steps": None, "stop": "trace"}  # the pipelined loop
    run_dir = tmp_path / "eng" / "w_r30" / "fcfs"
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"model": "qwen2.5-7b", "engine": engine}))
    slower = simulate_engine_loop(
        _requests(3, n=150), m, POLICIES["fcfs"], MODEL.scaled(1.02), 20.0, True
    )  # a lease 2% slower than the model
    run = Run(Source(str(tmp_path / "eng"), str(tmp_path / "manifest.json")), "w_r30", "fcfs",
              slower)  # fmt: skip
    fits = {"engine": MODEL, "physical": MODEL}
    scaled = compare_run(run, fits, 1.02)
    for k in ("itl_mean", "e2e_mean", "ttft_mean"):
        assert scaled[f"{k}_err_physical"] == pytest.approx(0.0, abs=1e-12)
    raw = compare_run(run, fits, 1.0)
    assert -0.025 < raw["itl_mean_err_physical"] < -0.015  # ~1/1.02 - 1
    assert raw["goodput_measured"] == scaled["goodput_sim_physical"]
    assert raw["cliff_pts"] >= 0 and raw["on_cliff"] == (raw["cliff_pts"] > 3)


def test_the_gpu_manifest_plan_probe_at_zero_loads_interleaved_anchor_a_committed_case():
    from experiments.fidelity import PRESETS
    from experiments.lowo_workloads import ANCHOR, LOADS, WORKLOADS, cases, probe_requests

    probe = probe_requests()
    assert len(probe) == 96 and all(r.arrival_time == 0.0 for r in probe)
    assert sorted({(r.num_prompt_tokens, r.true_output_tokens) for r in probe}) == [
        (256, 200),
        (1024, 32),
    ]
    for model, loads in LOADS.items():
        names = [name for name, _, _ in cases(model)]
        assert names[:3] == [f"{w}_r{loads[w][0]:g}" for w in WORKLOADS]  # lower loads first
        assert names[3:] == [f"{w}_r{loads[w][1]:g}" for w in WORKLOADS]
        assert all(lo < hi for lo, hi in loads.values())
        assert ANCHOR[model] in {c[0] for c in PRESETS[model].cases}  # a committed case


def _one_run(tmp_path, records_of):  # noqa: ANN001
    """A ``Run`` of 150 requests at 30 req/s whose engine records are ``records_of(requests,
    manifest)``, and the manifest's pieces."""
    from experiments.fidelity import POLICIES
    from experiments.fidelity_manifest import Case, Manifest
    from horizon.workload.requests_file import save_requests

    tmp_path.mkdir(parents=True, exist_ok=True)
    save_requests(_requests(3, n=150), tmp_path / "w_r30.json")
    case = Case("w_r30", "fidelity", "w", 30.0, 0, "w_r30.json", ("fcfs",), 20.0)
    m = Manifest("qwen2.5-7b", {"num_blocks": 800}, 1.0, 0.05, dict(POLICIES), (case,))
    m.save(tmp_path / "manifest.json")
    run_dir = tmp_path / "eng" / "w_r30" / "fcfs"
    run_dir.mkdir(parents=True)
    meta = {"model": "qwen2.5-7b", "engine": {"async_steps": None, "stop": "trace"}}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    records = records_of(_requests(3, n=150), m, POLICIES["fcfs"])
    return Run(Source(str(tmp_path / "eng"), str(tmp_path / "manifest.json")), "w_r30", "fcfs",
               records)  # fmt: skip


def _scatter_model():
    """``MODEL`` with a wide made-up scatter: ratios 0.7-1.3, mixed 0.8-1.2."""
    import numpy as np

    rng = np.random.default_rng(0)
    return dataclasses.replace(
        MODEL, residuals=(rng.uniform(0.7, 1.3, 5000), rng.uniform(0.8, 1.2, 800))
    )


def test_the_band_holds_an_engine_run_that_is_one_of_its_seeds_and_not_a_far_slower_one(tmp_path):
    from experiments.fidelity_compare import simulate_engine_loop
    from experiments.lowo_runs import compare_run

    model = _scatter_model()

    def noisy(requests, m, policy):  # noqa: ANN001, ANN202 - an engine that is seed 3's noise
        return simulate_engine_loop(requests, m, policy, model.with_noise(3), 20.0, True)

    fits = {"engine": model, "physical": model}
    row = compare_run(_one_run(tmp_path / "a", noisy), fits, 1.0, (0, 1, 2, 3))
    lo, hi = row["goodput_band_physical"]
    assert lo <= row["goodput_measured"] <= hi and row["in_band_physical"]

    def slow(requests, m, policy):  # noqa: ANN001, ANN202 - every step 4x as long: ITL > 50 ms
        return simulate_engine_loop(requests, m, policy, model.scaled(4.0), 20.0, True)

    row = compare_run(_one_run(tmp_path / "b", slow), fits, 1.0, (0, 1))
    assert row["goodput_measured"] < row["goodput_band_physical"][0] - 0.1
    assert not row["in_band_physical"]
    assert "in_band_physical" not in compare_run(_one_run(tmp_path / "c", slow), fits, 1.0)


def test_the_physical_fit_keeps_its_online_steps_scatter_and_resamples_it_by_seed():
    import numpy as np

    from tests.test_physical_cost_model import _steps

    rows = _steps(np.random.default_rng(0), 400)
    rows[:, -1] *= np.random.default_rng(1).uniform(0.9, 1.1, len(rows))  # measured scatter
    fit = PhysicalCostModel.fit(rows, model="qwen2.5-7b")
    dec, mix = fit.residuals
    kept = rows[(rows[:, 0] + rows[:, 1]) > 0]
    assert len(mix) == int((kept[:, 0] > 0).sum()) and len(dec) + len(mix) == len(kept)
    ratio = kept[:, -1] / fit.predict_rows(kept)
    assert np.array_equal(np.sort(np.concatenate([dec, mix])), np.sort(ratio))
    assert ratio.std() > 0.03  # the scatter is kept, not fitted away
    assert fit.scaled(1.1).residuals is fit.residuals
    plan = SimpleNamespace(decodes=(1, 2), prefills=(), num_prefill_tokens=0, is_empty=False,
                           prefill_attention_pairs=0, decode_context_tokens=300,
                           prefill_context_tokens=0, num_refreshed=0, preempted=())  # fmt: skip
    a, b, c = (fit.with_noise(s, 4) for s in (1, 1, 2))
    ta = [a.step_time(plan) for _ in range(30)]
    assert ta == [b.step_time(plan) for _ in range(30)]
    assert ta != [c.step_time(plan) for _ in range(30)]
    assert set(np.round(np.array(ta) / fit.step_time(plan), 12)) <= set(np.round(dec, 12))
    with pytest.raises(ValueError, match="with_noise needs residuals"):
        MODEL.with_noise(0)
