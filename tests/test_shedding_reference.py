"""The hindsight shedding reference (experiments/shedding_reference.py): which requests give
way, how the kept ones are rebuilt, and that a run sheds exactly what it says."""

from __future__ import annotations

import numpy as np
import pytest
from hydra import initialize_config_dir

from experiments.config_store import register_configs
from experiments.gain_runner import Plan, Runner
from experiments.policy_gain import REPO
from experiments.shedding_reference import (
    SHED_POLICIES,
    ShedRun,
    ShedRunner,
    best,
    shed,
    shed_mask,
    token_steps,
)
from horizon.request import SLO, Request


def _req(i: int, t: float, p: int, o: int) -> Request:
    return Request(
        request_id=i,
        arrival_time=t,
        num_prompt_tokens=p,
        max_output_tokens=4096,
        true_output_tokens=o,
        slo=SLO(ttft=1.0, itl=0.05),
        conversation_id=100 + i,
    )


def test_token_steps_are_the_blocks_held_summed_over_decode_steps():
    # prompt 10, reply 4: p*o for the prompt's blocks, o^2/2 for the reply's (the growing
    # triangle, counted continuously): 40 + 8
    assert token_steps(np.array([10]), np.array([4]))[0] == pytest.approx(48.0)
    a = token_steps(np.array([100, 0, 7]), np.array([1, 50, 0]))
    assert a.tolist() == [100.5, 1250.0, 0.0]
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        token_steps(np.array([-1]), np.array([3]))
    with pytest.raises(ValueError, match="prompts against"):
        token_steps(np.array([1, 2]), np.array([3]))


def test_the_costliest_floor_fraction_give_way_and_ties_drop_the_later():
    cost = np.array([5.0, 9.0, 1.0, 9.0, 7.0, 2.0, 3.0, 4.0, 6.0, 8.0])
    assert np.flatnonzero(shed_mask(cost, 0.2)).tolist() == [1, 3]
    # 0.25 of 10 -> 2 requests (floor): the same two
    assert shed_mask(cost, 0.25).tolist() == shed_mask(cost, 0.2).tolist()
    # a tie at the cut: of the two 9s only one goes with 0.1, and it is the later one
    assert np.flatnonzero(shed_mask(cost, 0.1)).tolist() == [1]
    assert not shed_mask(cost, 0.0).any()
    assert np.flatnonzero(shed_mask(cost, 0.3)).tolist() == [1, 3, 9]
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="fraction must be in"):
            shed_mask(cost, bad)


def test_kept_requests_keep_order_and_arrivals_and_are_renumbered():
    reqs = [_req(i, 0.5 * i, 10 + i, o) for i, o in enumerate([30, 400, 20, 300, 10])]
    cost = token_steps(
        np.array([r.num_prompt_tokens for r in reqs]),
        np.array([r.true_output_tokens for r in reqs]),
    )
    kept = shed(reqs, shed_mask(cost, 0.4))
    assert [r.request_id for r in kept] == [0, 1, 2]
    assert [r.arrival_time for r in kept] == [0.0, 1.0, 2.0]
    assert [r.true_output_tokens for r in kept] == [30, 20, 10]
    assert [r.conversation_id for r in kept] == [100, 102, 104]
    assert all(r.num_output_tokens == 0 for r in kept)
    with pytest.raises(ValueError, match="for 5 requests"):
        shed(reqs, shed_mask(cost[:4], 0.2))


def test_the_best_fraction_is_the_highest_mean_over_seeds():
    def runs(*goods: int) -> list[ShedRun]:
        return [ShedRun(fraction=0.0, n=100, kept=90, good=g, shed_token_steps=0.3) for g in goods]

    f, goods = best({0.0: runs(80, 90), 0.05: runs(88, 88), 0.1: runs(84, 95)})
    assert f == 0.1 and goods == [0.84, 0.95]
    assert best({0.0: runs(85, 87), 0.05: runs(86, 86)})[0] == 0.0  # tie: the smaller
    r = runs(45)[0]
    assert r.goodput == 0.45 and r.kept_goodput == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no runs"):
        best({})


@pytest.fixture(scope="module")
def shedder():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        plan = Plan(num_requests=300, seeds=(0,), iterations=1, lo=20.0, hi=200.0)
        yield ShedRunner(Runner(plan, [], SHED_POLICIES))


def test_no_shedding_is_the_policys_own_run_and_shedding_counts_the_shed_as_not_good(shedder):
    """At fraction 0 the reference is the plain run (the headline's Runner, same config); at
    0.1 a tenth of the requests is gone from the run and counted against its goodput."""
    plain = shedder.runner.metrics("horizon_oracle", 150.0)["goodput_lifetime"][0]
    none, tenth = shedder.runs("horizon_oracle", "true", 150.0, 0, [0.0, 0.1])
    assert none.kept == none.n == 300 and none.shed_token_steps == 0.0
    assert none.goodput == pytest.approx(plain)
    assert tenth.kept == 270 and tenth.good <= 270
    # the tenth shed by size holds far more than a tenth of the token-steps
    assert 0.25 < tenth.shed_token_steps < 1.0
    assert tenth.goodput == pytest.approx(tenth.good / 300)


def test_ranking_by_prediction_needs_a_predictor(shedder):
    with pytest.raises(ValueError, match="has no predictor"):
        shedder.runs("fcfs", "predicted", 40.0, 0, [0.0])
    with pytest.raises(ValueError, match="key must be one of"):
        shedder.runs("horizon_oracle", "exact", 40.0, 0, [0.0])


def test_ranking_by_prediction_reads_the_policys_own_predictor(shedder):
    """A noisy oracle's estimates at sigma 0.25 rank sizes well but not exactly: what it sheds
    holds a large share of the token-steps, less than what true sizes shed."""
    true = shedder.runs("horizon_oracle", "true", 150.0, 0, [0.1])[0]
    noisy = shedder.runs("horizon_noisy_s025", "predicted", 150.0, 0, [0.1])[0]
    assert noisy.kept == true.kept == 270
    assert 0.5 * true.shed_token_steps < noisy.shed_token_steps < true.shed_token_steps
