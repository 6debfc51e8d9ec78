"""Sweep figures say what they show: source (simulated or engine), SLO, seeds x requests; and
they show the seed spread, at one load or many. Synthetic results frames, no runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PathCollection, PolyCollection

from experiments import latency_figure
from experiments.figure_caption import runs_text, source
from experiments.figures import choose_rate, draw_goodput
from experiments.latency_figure import draw_latency_cdf

SIM = {
    "workload": "sharegpt_first_turn",
    "model": "qwen2.5-7b",
    "gpu": "H200",
    "num_blocks": 3000,
    "slo_name": "h200_7b",
    "slo_ttft": 1.0,
    "slo_itl": 0.05,
    "backend": "sim",
    "cost_model": "engine_fitted",
    "num_requests": 5000,
}
ENGINE = {**SIM, "backend": "engine", "cost_model": "measured", "gpu": "NVIDIA H200"}
SLO = "SLO h200_7b: TTFT ≤ 1 s and every ITL ≤ 50 ms (lifetime goodput)"


def frame(rates: list[float], seeds: list[int], policies=("fcfs", "sjf_prompt")) -> pd.DataFrame:
    rows = [
        {
            **SIM,
            "policy": p,
            "oracle": False,
            "rate": float(r),
            "seed": s,
            "goodput_lifetime": 0.9 - r / 400 - 0.1 * s - 0.2 * i,
            "goodput_tpot": 0.95 - r / 300 - 0.05 * s - 0.1 * i,
            "records_dir": f"runs/{p}_rate{r}_seed{s}/records",
        }
        for i, p in enumerate(policies)
        for r in rates
        for s in seeds
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("backend", "cost_model", "word"),
    [
        ("sim", "engine_fitted", "Simulated (engine-fitted cost model)"),
        ("sim", "roofline", "Simulated (roofline cost model)"),
        ("sim", "fitted", "Simulated (profiler-fitted cost model)"),
        ("engine", "measured", "Engine (measured on the GPU)"),
    ],
)
def test_source_comes_from_backend_and_cost_model(backend, cost_model, word):
    assert source({**SIM, "backend": backend, "cost_model": cost_model}) == word


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="run backend must be one of sim, engine.*'gpu_x'"):
        source({**SIM, "backend": "gpu_x"})


def test_runs_text_counts_seeds_per_point():
    assert runs_text(frame([10, 20], [0, 1, 2]), 5000) == "3 seeds × 5,000 requests"
    assert runs_text(frame([10], [0]), 400) == "1 seed × 400 requests"
    mixed = pd.concat([frame([10], [0, 1, 2]), frame([20], [0])])
    assert runs_text(mixed, 400) == "1-3 seeds × 400 requests"


@pytest.mark.parametrize(("setting", "word"), [(SIM, "Simulated ("), (ENGINE, "Engine (")])
def test_goodput_title_names_source_setting_slo_and_runs(setting, word):
    rows = frame([10, 20, 40], [0, 1, 2]).assign(**setting)
    fig = draw_goodput(setting, rows)
    title = fig.get_suptitle()
    assert title.startswith(word)
    for part in (SLO, "3 seeds × 5,000 requests", "3,000 KV blocks", "sharegpt_first_turn"):
        assert part in title
    assert f"{setting['model']} on {setting['gpu']}" in title
    left, right = (ax.get_title() for ax in fig.axes)
    assert left == "lifetime goodput: TTFT ≤ 1 s and every ITL ≤ 50 ms"
    assert right == "TPOT goodput: TTFT ≤ 1 s and mean TPOT ≤ 50 ms"
    assert all("requests/s" in ax.get_xlabel() for ax in fig.axes)


def test_single_load_shows_every_seed_and_the_min_max_bar():
    rows = frame([60], [0, 1, 2])
    fig = draw_goodput(SIM, rows)
    assert "goodput at 60 req/s" in fig.get_suptitle()
    for ax, metric in zip(fig.axes, ("goodput_lifetime", "goodput_tpot"), strict=True):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["fcfs", "sjf_prompt"]
        bars = [c for c in ax.collections if isinstance(c, LineCollection)]
        points = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert len(bars) == len(points) == 2  # one bar and one set of seed marks per policy
        for i, policy in enumerate(("fcfs", "sjf_prompt")):
            values = rows.loc[rows["policy"] == policy, metric].to_numpy()
            (segment,) = bars[i].get_segments()
            assert segment[:, 1].min() == pytest.approx(values.min())
            assert segment[:, 1].max() == pytest.approx(values.max())
            assert np.allclose(sorted(points[i].get_offsets()[:, 1]), sorted(values))
            assert len(set(points[i].get_offsets()[:, 0])) == 3  # side by side, not stacked
        lo, hi = ax.get_ylim()
        assert lo <= rows[metric].min() and hi >= rows[metric].max()


def test_several_loads_draw_mean_line_and_min_max_band():
    rows = frame([10, 20, 40], [0, 1, 2])
    ax = draw_goodput(SIM, rows).axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2
    fcfs = rows[rows["policy"] == "fcfs"]
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(fcfs["goodput_lifetime"].min())
    assert ys.max() == pytest.approx(fcfs["goodput_lifetime"].max())
    mean = fcfs.groupby("rate")["goodput_lifetime"].mean().to_numpy()
    assert np.allclose(ax.get_lines()[0].get_ydata(), mean)


def test_a_policy_at_one_load_beside_swept_ones_keeps_its_spread():
    rows = pd.concat([frame([10, 20, 40], [0, 1], ["fcfs"]), frame([30], [0, 1], ["horizon"])])
    ax = draw_goodput(SIM, rows).axes[0]
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 1
    assert sum(isinstance(c, LineCollection) for c in ax.collections) == 1
    legend = ax.figure.legends[0].get_title().get_text()
    assert "line: mean over seeds, band: min-max" in legend and "at one load: ◆ mean" in legend


def test_latency_cdfs_in_readable_units_with_slo_lines(monkeypatch):
    rng = np.random.default_rng(0)
    gaps = np.concatenate([rng.uniform(0.01, 0.04, 9990), np.full(10, 2.0)])  # s: 0.1% stalls
    monkeypatch.setattr(
        latency_figure, "_latencies", lambda dirs: (rng.uniform(0.05, 3.0, 500), gaps)
    )
    rows = frame([20, 60], [0, 1, 2])
    fig = draw_latency_cdf(ENGINE, rows.assign(**ENGINE), 60.0, "chosen")
    title = fig.get_suptitle()
    assert title.startswith("Engine (measured on the GPU)") and SLO in title
    assert "3 seeds × 5,000 requests" in title and "at 60 req/s" in title
    ax_ttft, ax_itl = fig.axes
    assert ax_itl.get_xscale() == "log" and "ms" in ax_itl.get_xlabel()
    assert ax_ttft.get_xscale() == "log" and "(s" in ax_ttft.get_xlabel()
    lo, hi = ax_itl.get_xlim()
    assert lo < 10 and 50 < 2000 <= hi < 4000  # ms: the stalls and the SLO shown, little more
    for ax, slo in ((ax_ttft, 1.0), (ax_itl, 50.0)):
        vlines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [slo, slo]]
        assert len(vlines) == 1
    assert [t.get_text() for t in ax_itl.get_yticklabels()][-2:] == ["99.9%", "99.99%"]


def test_latency_cdf_at_an_absent_rate_names_the_known_ones():
    with pytest.raises(ValueError, match="no runs at rate 30; rates: 20, 60"):
        draw_latency_cdf(SIM, frame([20, 60], [0]), 30.0, "chosen")


def test_choose_rate_skips_oracles_unless_alone():
    rows = frame([10, 100, 200], [0], ["fcfs"])
    oracle = frame([10, 100, 200], [0], ["oracle_srpt"]).assign(oracle=True, goodput_lifetime=1.0)
    rate, why = choose_rate(pd.concat([rows, oracle]))
    assert rate == 100.0 and "deployable" in why  # fcfs 0.65 at 100, 0.4 at 200
    assert choose_rate(oracle)[0] == 200.0


def test_legend_leaves_options_every_policy_of_a_name_shares_to_the_title():
    policies = [
        "fcfs",
        "horizon(headroom=0.05, triage=False)[learned]",
        "horizon(headroom=0.05, triage=True)[oracle]",
        "sjf_prompt(aging_tokens_per_s=100)",
    ]
    fig = draw_goodput(SIM, frame([10, 20], [0], policies))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [
        "fcfs",
        "horizon(triage=False)[learned]",
        "horizon(triage=True)[oracle]",
        "sjf_prompt(aging_tokens_per_s=100)",  # alone of its name: nothing to share
    ]
    assert "(options of every horizon: headroom=0.05)" in fig.get_suptitle()
