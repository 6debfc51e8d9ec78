"""experiments/headline_engine.py's comparison: fed "engine" runs that are the simulator's own
(same requests, policies, prepared predictions and cost model), it must find no difference, and
it must refuse engine runs of other requests."""

from __future__ import annotations

import dataclasses
import json

import pytest

import experiments.headline_engine as he
from experiments.fidelity_manifest import Case, Manifest, PolicySpec
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from predictors.prepared import PreparedPredictor
from simulator.engine_cost_model import EngineCostModel
from simulator.simulation import Simulation

MODEL = "qwen2.5-0.5b"  # a shape with a committed online calibration file
SLO_TTFT, SLO_ITL = 0.25, 0.025


def _requests(base: list[Request], rate: float) -> list[Request]:
    return [
        Request(
            i, i / rate, r.num_prompt_tokens, r.max_output_tokens, r.true_output_tokens, None,
            r.prompt_token_ids, r.conversation_id, r.turn_index,
            output_token_ids=r.output_token_ids,
        )
        for i, r in enumerate(base)
    ]  # fmt: skip


def _root(tmp_path, split, fitted, rate=150.0, seeds=(0, 1), only=None):
    """One seed<s>/ per seed as the GPU call leaves it, with the simulator as the engine
    (``only``: the policies an export of a subset holds)."""
    base = {s: split.test[40 * s : 40 * s + 40] for s in seeds}
    sc = SchedulerConfig(num_blocks=600, max_model_len=4096)
    cost = EngineCostModel.from_file(he.REPO / he._calibration(MODEL))
    for s in seeds:
        d = tmp_path / "engine" / f"seed{s}"
        d.mkdir(parents=True)
        reqs = _requests(base[s], rate)
        pred = d / "horizon_learned.predictions"
        fitted.save_prepared(reqs, pred)
        (d / "horizon_learned.predictions.sha256").write_text(PreparedPredictor(pred).digest())
        policies = {
            "fcfs": PolicySpec("fcfs"),
            "sjf_prompt": PolicySpec("sjf_prompt", {"aging_tokens_per_s": 100.0}),
            # the path the GPU machine read; compare swaps in the copy beside the records
            "horizon_learned": PolicySpec(
                "horizon", {"triage": True}, "prepared", {"path": "gpu_inputs/x.predictions"}
            ),
            "horizon_oracle": PolicySpec("horizon", {"triage": True}, "oracle"),
        }
        policies = {p: v for p, v in policies.items() if only is None or p in only}
        case = Case("headline", "headline", "sharegpt_first_turn", rate, s, "headline.json",
                     tuple(policies), reqs[-1].arrival_time + 30.0)  # fmt: skip
        m = Manifest(MODEL, dataclasses.asdict(sc), SLO_TTFT, SLO_ITL, policies, (case,),
                     {"num_requests": len(reqs)})  # fmt: skip
        m.save(d / "manifest.json")
        for p, spec in policies.items():
            if spec.predictor == "prepared":
                spec = dataclasses.replace(
                    spec, predictor_options={"path": str(d / "horizon_learned.predictions")}
                )
            rec = Simulation(
                _requests(base[s], rate), sc, spec.build(SLO_TTFT), cost,
                max_time=case.max_time, arrivals_at_step_boundaries=True, pipelined=True,
            ).run()  # fmt: skip
            out = d / "headline" / p
            out.mkdir(parents=True)
            rec.save_npz(str(out / "records.npz"))
            meta = {"gpu": "test", "date": "today", "engine": {"async_steps": None}}
            (out / "meta.json").write_text(json.dumps(meta))
    return tmp_path / "engine", base


def test_the_simulator_against_itself_agrees_exactly(tmp_path, monkeypatch, split, fitted):
    root, base = _root(tmp_path, split, fitted)
    monkeypatch.setattr(he, "_requests", lambda rate, seed: _requests(base[seed], rate))
    out = he.compare(str(root), str(tmp_path / "report"))
    assert out["seeds"] == [0, 1] and out["goodput_err_pts"] == {"mean": 0.0, "per_seed": 0.0}
    for p, metrics in out["mean"].items():
        for k, v in metrics.items():
            assert v["engine"] == pytest.approx(v["sim"]), (p, k)
    for v in out["gain"].values():
        assert v["engine"] == v["sim"]
    # the runs are not trivial: the learned predictor's runs differ from the oracle's
    g = out["per_seed"]
    assert any(
        g[s]["horizon_learned"]["preemptions"] != g[s]["horizon_oracle"]["preemptions"]
        or g[s]["horizon_learned"]["ttft_p99"] != g[s]["horizon_oracle"]["ttft_p99"]
        for s in g
    )
    # the "engine" steps are the cost model's own: no bias, no error
    for rows in out["per_seed"].values():
        for r in rows.values():
            assert r["steps"]["count"] > 0
            assert r["steps"]["bias_pct"] == pytest.approx(0, abs=0.01)
            assert r["steps"]["mape_pct"]["all"] == pytest.approx(0, abs=0.01)
    page = (tmp_path / "report" / "headline_engine.md").read_text()
    assert "| horizon_learned |" in page and "goodput, seed 1" in page
    # a modelled machine twice as fast: the simulated side moves, the engine's does not
    fast = he.compare(str(root), str(tmp_path / "fast"), cost_scale=0.5)
    assert fast["cost_scale"] == 0.5
    assert fast["per_seed"][0]["fcfs"]["steps"]["bias_pct"] == pytest.approx(-50, abs=0.01)
    for p in out["mean"]:
        assert fast["mean"][p]["e2e_mean"]["engine"] == out["mean"][p]["e2e_mean"]["engine"]
        assert fast["mean"][p]["e2e_mean"]["sim"] < 0.8 * out["mean"][p]["e2e_mean"]["sim"]


def test_engine_runs_of_other_requests_are_refused(tmp_path, monkeypatch, split, fitted):
    root, base = _root(tmp_path, split, fitted, seeds=(0,))
    other = {0: split.test[200:240]}
    monkeypatch.setattr(he, "_requests", lambda rate, seed: _requests(other[seed], rate * 1.1))
    with pytest.raises(ValueError, match="not the manifest's"):
        he.compare(str(root), str(tmp_path / "report"))
    with pytest.raises(FileNotFoundError, match="no seed"):
        he.compare(str(tmp_path / "nothing"), str(tmp_path / "report"))


def test_seeds_of_another_setting_are_refused(tmp_path, monkeypatch, split, fitted):
    root, base = _root(tmp_path, split, fitted)
    monkeypatch.setattr(he, "_requests", lambda rate, seed: _requests(base[seed], rate))
    m = Manifest.load(root / "seed1" / "manifest.json")
    (case,) = m.cases
    dataclasses.replace(m, cases=(dataclasses.replace(case, rate=case.rate * 2),)).save(
        root / "seed1" / "manifest.json"
    )
    with pytest.raises(ValueError, match="another setting"):
        he.compare(str(root), str(tmp_path / "report"))


def test_a_subset_of_policies_compares_without_the_missing_gains(
    tmp_path, monkeypatch, split, fitted
):
    """One policy at its own rate (e.g. its rate_at_90): its figures on both sides, and only
    the gains whose two policies ran."""
    root, base = _root(tmp_path, split, fitted, rate=200.0, only=("horizon_learned",))
    monkeypatch.setattr(he, "_requests", lambda rate, seed: _requests(base[seed], rate))
    out = he.compare(str(root), str(tmp_path / "report"))
    assert list(out["mean"]) == ["horizon_learned"] and out["rate"] == 200.0
    assert out["gain"] == {} and out["throughput_vs_fcfs"] is None
    assert out["engine_in_noise_band"] is None
    assert all(r["goodput_noise_band"] is None for rows in out["per_seed"].values()
               for r in rows.values())  # fmt: skip
    g = out["mean"]["horizon_learned"]["goodput_lifetime"]
    assert g["engine"] == pytest.approx(g["sim"]) and 0 < g["sim"] <= 1
    page = (tmp_path / "report" / "headline_engine.md").read_text()
    assert "| horizon_learned |" in page and "| fcfs |" not in page
    two = _root(tmp_path / "two", split, fitted, only=("fcfs", "horizon_learned"))[0]
    out = he.compare(str(two), str(tmp_path / "report2"))
    assert list(out["gain"]) == ["horizon_learned_vs_fcfs"] and out["throughput_vs_fcfs"]
    # predictions not kept beside the records are rebuilt (here by the fixture's predictor,
    # as export built them): the same figures
    rebuilt = []

    def rebuild(policy, rate, seed, requests, path):
        rebuilt.append((policy, rate, seed))
        fitted.save_prepared(requests, path)

    monkeypatch.setattr(he, "_rebuild_predictions", rebuild)
    for s in (0, 1):
        (two / f"seed{s}" / "horizon_learned.predictions").unlink()
    again = he.compare(str(two), str(tmp_path / "report3"))
    assert rebuilt == [("horizon_learned", 150.0, 0), ("horizon_learned", 150.0, 1)]
    assert again["per_seed"] == out["per_seed"]
    # checked against the digest of what the engine replayed: other predictions are refused
    digest = two / "seed1" / "horizon_learned.predictions.sha256"
    digest.write_text("0" * 64)
    with pytest.raises(ValueError, match="not those the engine replayed"):
        he.compare(str(two), str(tmp_path / "report4"))
    digest.unlink()
    with pytest.raises(ValueError, match="neither"):
        he.compare(str(two), str(tmp_path / "report5"))


@pytest.mark.parametrize("policies", [("fcfs", "lifo"), (), ("fcfs", "fcfs")])
def test_export_refuses_unknown_or_repeated_policies(tmp_path, policies):
    with pytest.raises(ValueError, match="distinct names"):
        he.export(50.0, (0,), str(tmp_path), policies)


def test_noise_seeds_set_the_simulators_spread_beside_the_engine(
    tmp_path, monkeypatch, split, fitted
):
    root, base = _root(tmp_path, split, fitted, rate=400.0, seeds=(0,), only=("fcfs",))
    monkeypatch.setattr(he, "_requests", lambda rate, seed: _requests(base[seed], rate))
    out = he.compare(str(root), str(tmp_path / "report"), noise_seeds=3)
    r = out["per_seed"][0]["fcfs"]
    lo, hi = r["goodput_noise_band"]
    assert 0 <= lo <= hi <= 1 and out["noise_seeds"] == 3
    # the steps scatter: the noisy runs are not the deterministic one's copies
    noisy = EngineCostModel.from_file(he.REPO / he._calibration(MODEL)).with_noise(0)
    assert noisy.step_time(_plan()) != noisy.model.step_time(_plan())
    assert out["engine_in_noise_band"] in ("0/1", "1/1")
    assert out["engine_in_noise_band"] == ("1/1" if lo - 0.005 <= r["goodput_lifetime"]["engine"]
                                           <= hi + 0.005 else "0/1")  # fmt: skip
    assert "simulator with scatter" in (tmp_path / "report" / "headline_engine.md").read_text()
    for bad in ({"noise_seeds": -1}, {"noise_seeds": 2, "cost_scale": 0.99}):
        with pytest.raises(ValueError, match="noise_seeds"):
            he.compare(str(root), str(tmp_path / "bad"), **bad)


def _plan():
    from horizon.plan import StepPlan

    reqs = [Request(i, 0.0, 100, 10, 10) for i in range(8)]
    return StepPlan(0, 0.0, tuple(reqs), (), decode_context_tokens=8 * 300)


def _doc(noise_seeds: int = 3) -> dict:
    """A small headline_engine.json as written: one seed, fcfs and horizon_learned."""

    def run(goodput: float, scale: float) -> dict:
        r = {k: {"engine": scale * (i + 1.5), "sim": scale * (i + 1.25)}
             for i, k in enumerate(he.METRICS)}  # fmt: skip
        r["goodput_lifetime"] = {"engine": goodput, "sim": goodput - 0.1}
        r["steps"] = {"count": 900, "mape_pct": {"all": 2.5, "decode_only": 2.0, "mixed": 6.25},
                      "bias_pct": 0.5, "decode_bias_pct": None}  # fmt: skip
        r["goodput_noise_band"] = [goodput - 0.2, goodput] if noise_seeds else None
        return r

    per_seed = {0: {"fcfs": run(0.6, 1.0), "horizon_learned": run(0.9, 2.0)}}
    mean = he._means(per_seed)
    doc = {
        "rate": 59.51, "seeds": [0], "num_requests": 40, "max_time_s": 98.04,
        "model": "qwen2.5-7b", "gpu": "NVIDIA H200", "date": "2026-11-29", "torch": "2.11",
        "triton": "3.6", "cost_model": "calibration/x.csv.gz", "cost_scale": 1.0,
        "noise_seeds": noise_seeds, "engine_in_noise_band": "1/2" if noise_seeds else None,
        "mean": mean, "goodput_spread": he._spread(per_seed), "per_seed": per_seed,
        **he._gains(mean), "goodput_err_pts": {"mean": 10.0, "per_seed": 10.0},
        "workload": "sharegpt_first_turn",
        "slo": {"ttft_s": 1.0, "itl_s": 0.05, "preset": "h200_7b", "goodput": "lifetime"},
        "scheduler": {"num_blocks": 3000}, "drain_s": 30.0,
        "engine": {"dir": "ENG", "dates": ["2026-11-29"], "commits": []}, "report_dir": "OUT",
    }  # fmt: skip
    return json.loads(json.dumps(doc))


def _halved(x):  # noqa: ANN001, ANN202
    if isinstance(x, dict):
        return {k: _halved(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_halved(v) for v in x]
    return x / 2 if isinstance(x, float) else x


def test_the_page_renders_the_json_and_no_sentence_depends_on_a_figure(tmp_path):
    from experiments.headline_page import write_page

    doc = _doc()
    page = write_page(doc, tmp_path / "a.md")
    assert "| fcfs | 0.600 [0.600, 0.600] / 0.500 [0.500, 0.500] | 0.600 / 0.500 |" in page
    assert "| goodput horizon_learned / fcfs | 1.5 | 1.6 |" in page
    assert "| throughput horizon_learned / fcfs | 2.0 | 2.0 |" in page
    assert "| 0 | fcfs | 900 | +0.50 | - | 2.50 | 6.25 |" in page  # no decode-only steps
    assert "| 0 | horizon_learned | 0.900 | 0.800 | 0.700-0.900 |" in page
    assert "TTFT ≤ 1 s and every ITL ≤ 50 ms" in page and "1 seed (0) × 40 requests" in page
    assert "compare ENG --out OUT --noise-seeds 3" in page
    figures = ("mean", "goodput_spread", "per_seed", "gain", "throughput_vs_fcfs")
    half = write_page({**doc, **{k: _halved(doc[k]) for k in figures}}, tmp_path / "b.md")
    assert half != page

    def prose(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith("|")]

    assert prose(half) == prose(page)
    bare = write_page(_doc(noise_seeds=0), tmp_path / "c.md")
    assert "(not simulated: `--noise-seeds 0`)" in bare and "simulator with scatter" not in bare
