"""Helpers for tests and quick checks: tiny configs, and running prompts through DenseAttention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .config import ModelConfig
from .decoder import CausalLM
from .dense_attention import DenseAttention, DenseKVCache


def tiny_hf_config(model_type: str = "qwen2", **overrides: Any) -> dict[str, Any]:
    """A HF ``config.json`` dict of a small decoder (hidden 64, 4 heads of 16, GQA 4:1,
    2 layers, vocab 512, fp32); ``overrides`` replace or add fields."""
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def tiny_config(model_type: str = "qwen2", **overrides: Any) -> ModelConfig:
    return ModelConfig.from_hf_config(tiny_hf_config(model_type, **overrides), name="tiny")


def forward_prompts(
    model: CausalLM,
    chunks: Sequence[Sequence[int]],
    caches: Sequence[DenseKVCache],
) -> torch.Tensor:
    """Run one flat batch made of each sequence's next tokens ``chunks[i]`` (its past being
    ``caches[i]``, which grows); return fp32 logits ``[sum(len(chunk)), vocab]``."""
    device = model.embed_tokens.weight.device
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int64, device=device)
    positions = torch.tensor(
        [len(cache) + i for c, cache in zip(chunks, caches) for i in range(len(c))],
        dtype=torch.int64,
        device=device,
    )
    attention = DenseAttention([len(c) for c in chunks], caches, model.config.attention_scale)
    with torch.no_grad():
        return model.compute_logits(model(ids, positions, attention))


def greedy_decode(model: CausalLM, prompt: Sequence[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decode of one sequence with contiguous (non-paged) caches: ``n`` tokens, and the
    fp32 logits of the last step (after the last token)."""
    cache = DenseKVCache(model.config.num_layers)
    logits = forward_prompts(model, [list(prompt)], [cache])[-1]
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = forward_prompts(model, [[out[-1]]], [cache])[-1]
    return out, logits
