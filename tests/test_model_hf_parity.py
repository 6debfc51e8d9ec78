"""The decoder's logits equal HF transformers' for the same config and weights (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from executor.model import CausalLM, DenseKVCache, ModelConfig
from executor.model.testing import forward_prompts, tiny_hf_config
from executor.weights import export_hf_state_dict, random_weights

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 17, 300, 2, 2, 41, 99, 511, 0, 64, 8], [1], [400, 3, 3, 3, 250, 12]]

VARIANTS = {
    "qwen2-gqa4-untied": tiny_hf_config("qwen2"),
    "qwen2-mha-tied": tiny_hf_config("qwen2", num_key_value_heads=4, tie_word_embeddings=True),
    "llama-gqa4-untied": tiny_hf_config("llama", num_hidden_layers=3, rms_norm_eps=1e-5),
    "llama-mha-bias-tied": tiny_hf_config(
        "llama", num_key_value_heads=4, attention_bias=True, tie_word_embeddings=True
    ),
    "llama-gqa2-llama3-rope": tiny_hf_config(
        "llama",
        num_key_value_heads=2,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


def _hf_model(cfg: dict):
    config_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[cfg["model_type"]]
    return model_cls(config_cls.from_dict(cfg)).eval()


def _same_weights(cfg: dict, seed: int = 0):
    model = CausalLM(ModelConfig.from_hf_config(cfg))
    random_weights(model, seed, std=0.2)  # large enough that attention is far from uniform
    hf = _hf_model(cfg)
    result = hf.load_state_dict(export_hf_state_dict(model), strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= ({"lm_head.weight"} if cfg["tie_word_embeddings"] else set())
    return model, hf


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_hf(variant: str) -> None:
    cfg = VARIANTS[variant]
    model, hf = _same_weights(cfg)
    caches = [DenseKVCache(model.config.num_layers) for _ in PROMPTS]
    mine = forward_prompts(model, PROMPTS, caches).split([len(p) for p in PROMPTS])
    for prompt, logits in zip(PROMPTS, mine):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].float()
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
        assert ref.std() > 1.0  # the comparison is not between near-constant logits


def test_llama3_rope_positions_past_original_context_match_hf() -> None:
    """Positions far beyond original_max_position_embeddings, where llama3 scaling bites."""
    cfg = VARIANTS["llama-gqa2-llama3-rope"]
    model, hf = _same_weights(cfg, seed=3)
    prompt = [(7 * i) % 512 for i in range(200)]
    logits = forward_prompts(model, [prompt], [DenseKVCache(model.config.num_layers)])
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
