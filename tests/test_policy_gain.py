"""The headline command's pieces (experiments/policy_gain.py): the bisection and the summary's
record of the setting the runs resolved."""

from __future__ import annotations

import pytest
from hydra import initialize_config_dir

from experiments.config_store import register_configs
from experiments.policy_gain import FULL, POLICIES, REPO, Plan, Runner, _summary, bisect_rate

PLAN = Plan(num_requests=10, seeds=(0, 1), iterations=8, lo=20.0, hi=200.0)


def test_bisection_finds_the_highest_rate_that_holds_the_target():
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
    """fcfs's goodput falls from 0.62 to 0.2 at 59.43 req/s: the plan's 0.7 req/s steps stop at
    a rate holding 0.62; the refinement goes on until the goodput is within the tolerance."""
    plan = Plan(num_requests=10, seeds=(0,), iterations=8, lo=20.0, hi=200.0, refine=6)

    def goodput(rate: float) -> float:
        if rate > 59.43:
            return 0.2
        return 0.5 + 0.12 * min(1.0, (59.43 - rate) / 0.1)  # 0.62 ... 0.5 over the last 0.1

    coarse = bisect_rate(goodput, 0.5, plan)
    fine = bisect_rate(goodput, 0.5, plan, tolerance=0.03)
    assert goodput(coarse) > 0.53  # where the coarse steps stop
    assert 0.5 <= goodput(fine) <= 0.53 and coarse <= fine <= 59.43
    # a target already met within the tolerance takes no extra step
    asked = []
    bisect_rate(lambda r: asked.append(r) or (0.51 if r <= 100 else 0.1), 0.5, plan, 0.03)
    assert len(set(asked)) == 2 + plan.iterations


def _table(policies: list[str]) -> dict:
    metrics = {
        "goodput_lifetime": [0.5, 0.6],
        "throughput_tok_s": [100.0, 110.0],
        "ttft_p99": [1.0, 2.0],
        "recompute_waste": [0.1, 0.1],
        "queue_wait_max": [3.0, 4.0],
        "itl_p99": [0.04, 0.05],
        "preemptions": [7, 9],
    }
    return {p: metrics for p in policies}


@pytest.mark.parametrize(
    ("override", "cost_model"), [([], "engine_fitted"), (["backend=sim"], "roofline")]
)
def test_the_summary_records_the_setting_the_runs_resolved(override, cost_model):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = Runner(FULL, override).config("fcfs", 88.2, 0)
    table = _table(list(POLICIES))
    rate90 = {p: 80.0 for p in POLICIES}
    out = _summary(88.2, table, rate90, PLAN, 14, 1.0, cfg, override)
    s = out["setting"]
    assert s["cost_model"] == cost_model and s["overrides"] == override
    assert s["model"] == "qwen2.5-7b" and s["num_blocks"] == 3000 and s["slo"] == "h200_7b"
    assert out["goodput"]["fcfs"] == pytest.approx(0.55)
    assert out["goodput_spread"]["fcfs"] == [0.5, 0.6]
    assert out["ratios"]["goodput_vs_fcfs"] == 1.0
