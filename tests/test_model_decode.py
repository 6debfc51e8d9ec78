"""Prefill then decode through DenseAttention gives the logits of one full prefill, however the
tokens are split into steps and batched."""

from __future__ import annotations

import pytest
import torch

from executor.model import CausalLM, DenseAttention, DenseKVCache
from executor.model.testing import forward_prompts, tiny_config
from executor.weights import random_weights

SEQS = [[(13 * i + 5 * s) % 512 for i in range(n)] for s, n in enumerate([12, 7, 20])]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request: pytest.FixtureRequest) -> CausalLM:
    m = CausalLM(tiny_config(request.param, num_hidden_layers=3))
    random_weights(m, 11, std=0.2)
    return m


def _full(model: CausalLM, seq: list[int]) -> torch.Tensor:
    return forward_prompts(model, [seq], [DenseKVCache(model.config.num_layers)])


def test_prefill_then_decode_matches_full_prefill(model: CausalLM) -> None:
    for seq in SEQS:
        cache = DenseKVCache(model.config.num_layers)
        prompt_len = 4
        logits = [forward_prompts(model, [seq[:prompt_len]], [cache])]
        for tok in seq[prompt_len:]:
            logits.append(forward_prompts(model, [[tok]], [cache]))
        assert len(cache) == len(seq)
        torch.testing.assert_close(torch.cat(logits), _full(model, seq), atol=1e-4, rtol=1e-4)


def test_mixed_batches_of_chunks_and_decodes(model: CausalLM) -> None:
    """Each step runs one prefill chunk of one sequence and one decode token of the others."""
    caches = [DenseKVCache(model.config.num_layers) for _ in SEQS]
    got: list[list[torch.Tensor]] = [[] for _ in SEQS]
    first_chunk = [5, 7, 3]  # then seq 2 continues in chunks of 9 while the others decode
    start_step = [0, 1, 2]
    step = 0
    while any(len(c) < len(s) for c, s in zip(caches, SEQS)):
        sizes = []
        for i, (seq, cache) in enumerate(zip(SEQS, caches)):
            n = 0 if step < start_step[i] else first_chunk[i] if not len(cache) else 1
            n = 9 if i == 2 and len(cache) else n
            sizes.append(min(n, len(seq) - len(cache)))
        active = [i for i, n in enumerate(sizes) if n]
        chunks = [SEQS[i][len(caches[i]) : len(caches[i]) + sizes[i]] for i in active]
        out = forward_prompts(model, chunks, [caches[i] for i in active])
        for i, rows in zip(active, out.split([len(c) for c in chunks])):
            got[i].append(rows)
        step += 1
    for seq, rows, cache in zip(SEQS, got, caches):
        assert len(cache) == len(seq)
        torch.testing.assert_close(torch.cat(rows), _full(model, seq), atol=1e-4, rtol=1e-4)


def test_batched_prefill_equals_separate_prefills(model: CausalLM) -> None:
    caches = [DenseKVCache(model.config.num_layers) for _ in SEQS]
    batched = forward_prompts(model, SEQS, caches).split([len(s) for s in SEQS])
    for seq, logits in zip(SEQS, batched):
        torch.testing.assert_close(logits, _full(model, seq), atol=1e-4, rtol=1e-4)


def test_forward_shapes_and_cache_contents(model: CausalLM) -> None:
    config = model.config
    cache = DenseKVCache(config.num_layers)
    ids = torch.tensor(SEQS[0])
    attention = DenseAttention([len(ids)], [cache])
    with torch.no_grad():
        hidden = model(ids, torch.arange(len(ids)), attention)
    assert hidden.shape == (len(ids), config.hidden_size)
    assert model.compute_logits(hidden[-1:]).shape == (1, config.vocab_size)
    assert all(k.shape == (len(ids), config.num_kv_heads, config.head_dim) for k in cache.keys)
    with pytest.raises(ValueError, match="query lengths"):
        DenseAttention([3, 4], [cache])
