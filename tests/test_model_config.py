"""ModelConfig from HF config dicts and the published presets."""

from __future__ import annotations

import pytest

from executor.model import ModelConfig, RopeScaling, hf_config_for_preset, preset_names
from executor.model.testing import tiny_hf_config
from horizon.model_shape import model_shape

LLAMA31_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def test_presets_have_published_values() -> None:
    q05 = ModelConfig.for_preset("qwen2.5-0.5b")
    assert (q05.hidden_size, q05.num_layers, q05.num_heads, q05.num_kv_heads) == (896, 24, 14, 2)
    assert (q05.intermediate_size, q05.vocab_size, q05.head_dim) == (4864, 151936, 64)
    assert q05.tie_word_embeddings and q05.qkv_bias and not q05.o_proj_bias
    assert (q05.rope_theta, q05.rms_norm_eps, q05.rope_scaling) == (1e6, 1e-6, None)

    q7 = ModelConfig.for_preset("qwen2.5-7b")
    assert (q7.hidden_size, q7.num_layers, q7.num_heads, q7.num_kv_heads) == (3584, 28, 28, 4)
    assert (q7.intermediate_size, q7.vocab_size, q7.head_dim) == (18944, 152064, 128)
    assert not q7.tie_word_embeddings and q7.qkv_bias and q7.rope_theta == 1e6

    ll = ModelConfig.for_preset("llama-3-8b")
    assert (ll.hidden_size, ll.num_layers, ll.num_heads, ll.num_kv_heads) == (4096, 32, 32, 8)
    assert (ll.intermediate_size, ll.vocab_size, ll.head_dim) == (14336, 128256, 128)
    assert not ll.tie_word_embeddings and not ll.qkv_bias and not ll.o_proj_bias
    assert (ll.rope_theta, ll.rms_norm_eps, ll.rope_scaling) == (500000.0, 1e-5, None)
    assert ll.max_position_embeddings == 8192 and ll.dtype == "bfloat16"

    # Published parameter counts: 0.49B, 7.62B, 8.03B.
    assert round(q05.shape.num_params / 1e9, 2) == 0.49
    assert round(q7.shape.num_params / 1e9, 2) == 7.62
    assert round(ll.shape.num_params / 1e9, 2) == 8.03


@pytest.mark.parametrize("name", preset_names())
def test_presets_agree_with_horizon_shapes(name: str) -> None:
    shape = ModelConfig.for_preset(name).shape
    assert shape == model_shape(name)


@pytest.mark.parametrize("name", preset_names())
def test_hf_dict_round_trip(name: str) -> None:
    config = ModelConfig.for_preset(name)
    assert ModelConfig.from_hf_config(config.to_hf_config(), name=name) == config
    assert hf_config_for_preset(name) is not hf_config_for_preset(name)  # fresh copies


def test_unknown_preset_lists_known() -> None:
    with pytest.raises(ValueError, match="qwen2.5-7b"):
        ModelConfig.for_preset("gpt-5")


@pytest.mark.parametrize(
    "field", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "model_type"]
)
def test_missing_field_is_named(field: str) -> None:
    cfg = hf_config_for_preset("qwen2.5-0.5b")
    del cfg[field]
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf_config(cfg)


def test_llama31_rope_scaling_parsed_and_round_tripped() -> None:
    cfg = hf_config_for_preset("llama-3-8b")
    cfg.update(rope_scaling=LLAMA31_SCALING, max_position_embeddings=131072)
    config = ModelConfig.from_hf_config(cfg)
    assert config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert config.to_hf_config()["rope_scaling"] == LLAMA31_SCALING
    assert ModelConfig.from_hf_config(config.to_hf_config()) == config


def test_transformers5_rope_parameters_layout() -> None:
    cfg = hf_config_for_preset("llama-3-8b")
    del cfg["rope_theta"], cfg["rope_scaling"]
    cfg["rope_parameters"] = {**LLAMA31_SCALING, "rope_theta": 500000.0}
    config = ModelConfig.from_hf_config(cfg)
    assert config.rope_theta == 500000.0 and config.rope_scaling is not None
    plain = tiny_hf_config("qwen2")
    del plain["rope_theta"]
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    config = ModelConfig.from_hf_config(plain)
    assert config.rope_theta == 1e6 and config.rope_scaling is None


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "sliding"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"torch_dtype": "int8"}, "dtype"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
    ],
)
def test_unsupported_configs_rejected(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_config({**tiny_hf_config("qwen2"), **overrides})


def test_derived_values() -> None:
    config = ModelConfig.from_hf_config(tiny_hf_config("llama", attention_bias=True))
    assert config.qkv_bias and config.o_proj_bias
    assert (config.q_size, config.kv_size) == (64, 16)
    assert config.attention_scale == pytest.approx(0.25)
    assert config.with_dtype("bfloat16").dtype == "bfloat16"
    assert config.with_dtype("bfloat16").shape == config.shape
