"""Registry, dataset split, and the predictors that need no model: mean, prompt_length, oracles."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from horizon.prediction import LengthDistribution
from horizon.request import Request
from horizon.workload.split import held_out_conversations
from predictors import LEVELS, make_predictor, predictor_names
from predictors.base import carried_forward
from predictors.dataset import SplitConfig, split_by_conversation, split_requests
from predictors.evaluation import mae_by_progress, remaining_cases, score

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "predictor"


def _req(rid: int, true: int, prompt: int = 50, max_out: int = 2048, conv: int = -1) -> Request:
    return Request(rid, 0.0, prompt, max_out, true, conversation_id=conv)


def _synthetic(n: int = 400, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(5, 2000))
        t = int(np.clip(rng.lognormal(5 + p / 2000, 0.6), 1, 2048))
        out.append(_req(i, t, prompt=p, conv=i // 3))
    return out


def _check_valid(d: LengthDistribution, hi: float) -> None:
    assert isinstance(d, LengthDistribution)
    assert d.levels == LEVELS
    assert 1 <= d.lo <= d.values[0]
    assert all(b >= a for a, b in zip(d.values, d.values[1:]))
    assert d.values[-1] <= d.hi <= hi


@pytest.fixture(scope="module")
def split(sharegpt_head):
    return split_requests(sharegpt_head, SplitConfig(seed=0, test_fraction=0.3))


# -- registry and configs -------------------------------------------------------------------------
def test_registry_names_and_errors():
    assert predictor_names() == [
        "learned", "mean", "noisy_oracle", "oracle", "prepared", "prompt_length"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="known: learned, mean, noisy_oracle, oracle"):
        make_predictor("nope")
    with pytest.raises(ValueError, match="bad options"):
        make_predictor("oracle", sigma=1.0)
    with pytest.raises(ValueError, match="sigma"):
        make_predictor("noisy_oracle", sigma=-1.0)
    with pytest.raises(ValueError, match="either artifact or settings"):
        make_predictor("learned", artifact="x.joblib", seed=1)


def test_every_config_builds():
    names = set()
    for path in CONFIGS.glob("*.yaml"):
        cfg = yaml.safe_load(path.read_text())
        p = make_predictor(cfg["name"], **(cfg.get("options") or {}))
        assert p.name == cfg["name"]
        names.add(cfg["name"])
    assert {"mean", "learned", "oracle", "noisy_oracle"} <= names


# -- dataset --------------------------------------------------------------------------------------
def test_split_is_by_conversation_and_seeded(sharegpt_head, split):
    train_c = {r.conversation_id for r in split.train}
    test_c = {r.conversation_id for r in split.test}
    assert not train_c & test_c
    ids = [r.request_id for r in (*split.train, *split.test)]
    assert ids == list(range(len(ids)))
    turns = {r.turn_index for r in split.train}
    assert 0 in turns and max(turns) >= 1  # first and later turns both present
    again = split_requests(sharegpt_head, SplitConfig(seed=0, test_fraction=0.3))
    assert [r.prompt_token_ids for r in again.test] == [r.prompt_token_ids for r in split.test]
    other = split_requests(sharegpt_head, SplitConfig(seed=1, test_fraction=0.3))
    assert {r.conversation_id for r in other.test} != test_c
    first = split_requests(sharegpt_head, SplitConfig(seed=0, max_turns=1))
    assert {r.turn_index for r in first.train} == {0}


def test_split_follows_the_workload_held_out_rule(sharegpt_head, split):
    held = held_out_conversations(sharegpt_head.num_conversations, 0, 0.3)
    assert {r.conversation_id for r in split.test} <= held
    assert not {r.conversation_id for r in split.train} & held
    small = split_requests(
        sharegpt_head, SplitConfig(seed=0, test_fraction=0.3, max_conversations=300)
    )
    assert small.info["conversations"] == 300
    assert {r.conversation_id for r in small.test} <= held
    assert not {r.conversation_id for r in small.train} & held
    assert small.train and small.test


def test_split_by_conversation_keeps_conversations_whole():
    reqs = _synthetic(300)
    rest, held = split_by_conversation(reqs, 0.25, seed=3)
    assert len(rest) + len(held) == len(reqs)
    assert not {r.conversation_id for r in rest} & {r.conversation_id for r in held}
    assert 0.15 < len(held) / len(reqs) < 0.35


def test_a_train_share_cuts_whole_training_conversations_and_keeps_the_test(split):
    from experiments.eval_predictors import train_share

    half = train_share(split, 0.5, seed=0)
    assert half.test is split.test
    convs = {r.conversation_id for r in split.train}
    kept = {r.conversation_id for r in half.train}
    assert kept < convs and 0.4 < len(kept) / len(convs) < 0.6
    # whole conversations: every request of a kept conversation is kept
    assert len(half.train) == sum(r.conversation_id in kept for r in split.train)
    assert half.info["train_fraction"] == 0.5 and half.info["train_requests"] == len(half.train)
    assert train_share(split, 0.5, seed=0).train == half.train  # seeded
    assert train_share(split, 1.0, seed=0) is split
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="train-fraction"):
            train_share(split, bad, seed=0)


def test_split_config_checks():
    with pytest.raises(ValueError, match="test_fraction"):
        SplitConfig(test_fraction=1.0)
    with pytest.raises(ValueError, match="max_turns"):
        SplitConfig(max_turns=0)


# -- mean and prompt_length -----------------------------------------------------------------------
def test_mean_is_constant_training_quantiles(split):
    p = make_predictor("mean")
    with pytest.raises(ValueError, match="fit"):
        p.predict(split.test[0])
    p.fit(split.train)
    y = [r.true_output_tokens for r in split.train]
    expected = np.quantile(y, LEVELS)
    for r in split.test[:20]:
        d = p.predict(r)
        _check_valid(d, r.max_output_tokens)
        assert np.allclose(d.values, expected)
        rem = p.update(r, 100)
        _check_valid(rem, r.max_output_tokens - 100)
        assert rem.values == d.remaining(100).values


def test_prompt_length_baseline_bins_and_carry_forward(split):
    p = make_predictor("prompt_length", bins=5).fit(split.train)
    short = min(split.test, key=lambda r: r.num_prompt_tokens)
    long = max(split.test, key=lambda r: r.num_prompt_tokens)
    assert p.predict(short).values != p.predict(long).values
    for r in split.test[:30]:
        d = p.predict(r)
        _check_valid(d, r.max_output_tokens)
        for g in (0, 1, 50, 500, 2047, 5000):
            rem = p.update(r, g)
            assert min(rem.values) >= 1 and rem.lo >= 1  # never below one token
            assert rem.values == tuple(max(v - g, 1.0) for v in d.values)
    with pytest.raises(ValueError, match="tokens_so_far"):
        p.update(split.test[0], -1)


def test_carried_forward_floor():
    d = LengthDistribution(LEVELS, tuple(float(10 * i) for i in range(1, 21)), 1.0, 300.0)
    rem = carried_forward(d, 250)
    assert rem.values[0] == 1.0 and rem.values[-1] == 1.0 and rem.hi == 50.0
    assert carried_forward(d, 10_000).hi == 1.0


# -- oracles --------------------------------------------------------------------------------------
def test_oracle_remaining_is_exact():
    p = make_predictor("oracle")
    assert p.reads_true_length
    r = _req(0, 300)
    assert p.predict(r).median == 300 and p.predict(r).quantile(0.99) == 300
    for g in range(0, 300, 7):
        d = p.update(r, g)
        assert d.values == tuple(float(300 - g) for _ in LEVELS)
        assert d.quantile(0.01) == d.quantile(0.99) == 300 - g
    assert p.update(r, 300).median == 1 and p.update(r, 1000).median == 1


def test_noisy_oracle_is_deterministic_per_request():
    p = make_predictor("noisy_oracle", sigma=0.5, margin=1.0, seed=7)
    assert p.reads_true_length
    reqs = [_req(i, 200 + i) for i in range(50)]
    first = [p.predict(r).values for r in reqs]
    again = [p.predict(r).values for r in reversed(reqs)][::-1]  # order does not matter
    assert first == again
    fresh = make_predictor("noisy_oracle", sigma=0.5, margin=1.0, seed=7)
    assert fresh.predict(_req(3, 203)).values == first[3]  # nothing carried between instances
    other = make_predictor("noisy_oracle", sigma=0.5, margin=1.0, seed=8)
    assert other.predict(reqs[3]).values != first[3]
    for r in reqs[:10]:
        _check_valid(p.predict(r), r.max_output_tokens)
        _check_valid(p.update(r, 150), r.max_output_tokens - 150)


def test_noisy_oracle_error_scales_with_sigma_and_margin():
    reqs = [_req(i, int(t)) for i, t in enumerate(np.linspace(100, 1000, 2000))]
    errs = []
    for sigma in (0.1, 0.3, 0.6):
        p = make_predictor("noisy_oracle", sigma=sigma, margin=1.0)
        e = np.median([abs(math.log(p.predict(r).median / r.true_output_tokens)) for r in reqs])
        assert e == pytest.approx(0.6745 * sigma, rel=0.15)  # median |N(0, sigma)|
        errs.append(e)
    assert errs == sorted(errs)
    exact = make_predictor("noisy_oracle", sigma=0.0, margin=1.0)
    assert all(exact.predict(r).median == r.true_output_tokens for r in reqs[:50])
    wide = make_predictor("noisy_oracle", sigma=0.0, margin=1.5)
    assert wide.predict(reqs[0]).median == pytest.approx(1.5 * reqs[0].true_output_tokens)


# -- evaluation helpers ---------------------------------------------------------------------------
def test_scores_of_the_oracle():
    reqs = [_req(i, t) for i, t in enumerate((5, 16, 17, 100, 333))]
    p = make_predictor("oracle")
    s = score([p.predict(r) for r in reqs], [r.true_output_tokens for r in reqs])
    assert s.mae == 0 and s.spearman == pytest.approx(1.0) and set(s.coverage) == {1.0}
    dists, truth, g = remaining_cases(p, reqs, step=16)
    assert len(truth) == sum(-(-r.true_output_tokens // 16) for r in reqs)
    assert score(dists, truth).mae == 0
    assert sum(b["n"] for b in mae_by_progress(dists, truth, g)) == len(truth)
