"""Batched sampling: greedy, filters, distributions, per-seed determinism."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from executor.sampling import SamplingBatch, SamplingParams, filtered_logits, sample, uniform

VOCAB = 8
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, -3.0])


def _batch(params: list[SamplingParams], steps: list[int] | None = None) -> SamplingBatch:
    return SamplingBatch.from_params(params, steps if steps is not None else [0] * len(params))


def _draws(p: SamplingParams, n: int = 20000, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    """n draws of one request at steps 0..n-1 (one batch of n rows)."""
    batch = _batch([p] * n, list(range(n)))
    return sample(logits.expand(n, -1).contiguous(), batch)


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    support = expected > 0
    assert counts[~support].sum() == 0, "drew a token outside the support"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


# Critical values of chi-square at p = 0.001; the draws are seeded, so these never flake.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def test_greedy_is_argmax_and_skips_sampling() -> None:
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(0))
    batch = _batch([SamplingParams(temperature=0.0, seed=i) for i in range(16)])
    assert batch.all_greedy
    assert torch.equal(sample(logits, batch), logits.argmax(-1))


def test_greedy_rows_in_a_sampled_batch_take_argmax() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=5, seed=i) for i in range(6)]
    tokens = sample(logits, _batch(params))
    assert torch.equal(tokens[1::2], logits[1::2].argmax(-1))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_k=1, seed=3),
        SamplingParams(temperature=1.5, top_p=1e-6, seed=3),
        SamplingParams(temperature=1.5, min_p=1.0, seed=3),
        SamplingParams(temperature=1e-4, seed=3),
    ],
    ids=["top_k=1", "top_p tiny", "min_p=1", "tiny temperature"],
)
def test_degenerate_filters_are_greedy(params: SamplingParams) -> None:
    logits = torch.randn(64, 300, generator=torch.Generator().manual_seed(2))
    tokens = sample(logits, _batch([params] * 64, list(range(64))))
    assert torch.equal(tokens, logits.argmax(-1))


def test_temperature_sampling_matches_softmax() -> None:
    for t in (0.7, 1.0, 2.0):
        tokens = _draws(SamplingParams(temperature=t, seed=11))
        assert _chi_square(tokens, torch.softmax(LOGITS / t, -1)) < CHI2_999[VOCAB - 1], t


def test_top_k_renormalises_over_k_most_likely() -> None:
    tokens = _draws(SamplingParams(temperature=1.0, top_k=3, seed=5))
    probs = torch.zeros(VOCAB)
    keep = torch.tensor([0, 6, 1])
    probs[keep] = torch.softmax(LOGITS[keep], -1)
    assert _chi_square(tokens, probs) < CHI2_999[2]


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    p = torch.softmax(LOGITS, -1)  # sorted: 0 (.33), 6 (.20), 1 (.12), 2 (.07), ...
    top_p = float(p[0] + p[6] + 0.5 * p[1])  # needs tokens 0, 6 and 1
    tokens = _draws(SamplingParams(temperature=1.0, top_p=top_p, seed=6))
    probs = torch.zeros(VOCAB)
    keep = torch.tensor([0, 6, 1])
    probs[keep] = p[keep] / p[keep].sum()
    assert _chi_square(tokens, probs) < CHI2_999[2]


def test_min_p_filters_relative_to_most_likely() -> None:
    p = torch.softmax(LOGITS, -1)
    min_p = 0.3  # keeps tokens with p >= 0.3 * p_max: logits >= 2 + ln 0.3 = 0.796
    tokens = _draws(SamplingParams(temperature=1.0, min_p=min_p, seed=7))
    keep = p >= min_p * p.max()
    assert keep.tolist() == [True, True, False, False, False, False, True, False]
    probs = torch.where(keep, p, 0.0)
    assert _chi_square(tokens, probs / probs.sum()) < CHI2_999[2]


def test_combined_filters_apply_in_order() -> None:
    """top_k=5 -> {0, 6, 1, 2, 3}; top_p over that -> {0, 6}; min_p=0.5 -> {0, 6} (.6 >= .5)."""
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.55, min_p=0.5, seed=1)
    logits = filtered_logits(LOGITS[None], _batch([params]))[0]
    assert torch.isfinite(logits).tolist() == [True, False, False, False, False, False, True, False]


def test_same_seed_and_step_same_token_whatever_the_batch() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 4000, generator=g) * 3
    params = [
        SamplingParams(
            temperature=[0.0, 0.8, 1.3][i % 3],
            top_k=[0, 50][i % 2],
            top_p=[1.0, 0.9, 0.5][i % 3],
            min_p=[0.0, 0.05][i % 2],
            seed=1000 + i,
        )
        for i in range(12)
    ]
    steps = list(range(12))
    tokens = sample(logits, _batch(params, steps))
    perm = torch.randperm(12, generator=g)
    shuffled = sample(logits[perm], _batch([params[i] for i in perm], [steps[i] for i in perm]))
    assert torch.equal(shuffled, tokens[perm])
    for i in range(12):  # alone, and beside a plain-temperature request (no sort needed)
        assert sample(logits[i : i + 1], _batch([params[i]], [steps[i]])).item() == tokens[i]
        plain = SamplingParams(temperature=1.0, seed=0)
        pair = sample(logits[[i, i]], _batch([params[i], plain], [steps[i], 0]))
        assert pair[0].item() == tokens[i]


def test_seed_and_step_change_the_draw() -> None:
    base = _draws(SamplingParams(temperature=1.0, seed=1), n=200)
    other_seed = _draws(SamplingParams(temperature=1.0, seed=2), n=200)
    assert not torch.equal(base, other_seed)
    assert len(set(base.tolist())) > 3  # steps differ, so draws differ


def test_uniform_is_uniform_and_pure() -> None:
    seed = torch.tensor([0, 1, -5, 2**40 + 3] * 5000)
    step = torch.arange(20000)
    u = uniform(seed, step)
    assert torch.equal(u, uniform(seed.clone(), step.clone()))
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    counts = torch.histc(u, bins=10, min=0, max=1)
    chi2 = ((counts - 2000) ** 2 / 2000).sum().item()
    assert chi2 < 27.88  # df 9, p = 0.001


def test_logits_not_modified_and_shape_checked() -> None:
    logits = torch.randn(3, 20)
    before = logits.clone()
    sample(logits, _batch([SamplingParams(temperature=1.0, top_k=3, top_p=0.5, min_p=0.1)] * 3))
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="batch of 2"):
        sample(logits, _batch([SamplingParams()] * 2))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 2.0},
        {"min_tokens": -1},
    ],
)
def test_bad_params_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_large_vocab_rare_tokens_never_drawn_when_filtered() -> None:
    logits = torch.full((1, 20000), -math.inf)
    logits[0, [7, 15000, 19999]] = torch.tensor([0.0, 0.1, -0.2])
    tokens = _draws(SamplingParams(temperature=1.0, seed=9), n=500, logits=logits[0])
    assert set(tokens.tolist()) == {7, 15000, 19999}


def test_suppressed_ids_are_not_drawn_before_min_tokens() -> None:
    """Token 3 is every row's argmax. Rows below their ``min_tokens`` never draw it (greedy or
    sampled, whatever the seed); at ``min_tokens`` it is back."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 9.0]]).repeat(4, 1)
    greedy = SamplingParams(min_tokens=2, suppress_ids=(3,))
    hot = SamplingParams(temperature=5.0, min_tokens=2, suppress_ids=(3, 0), seed=7)
    assert greedy.needs_sampler and not SamplingParams(min_tokens=2).needs_sampler
    batch = SamplingBatch.from_params([greedy, greedy, hot, SamplingParams()], [0, 2, 1, 0])
    assert sample(logits, batch).tolist()[:2] == [2, 3]
    assert sample(logits, batch)[3] == 3
    draws = {
        int(sample(logits[:1], SamplingBatch.from_params([replace(hot, seed=s)], [1]))[0])
        for s in range(200)
    }
    assert draws == {1, 2}  # never 3 or 0, both suppressed
    assert logits[0, 3] == 9.0  # the caller's logits are untouched
