"""Safetensors save/load, named errors, sharded checkpoints, seeded random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.model import CausalLM, DenseKVCache
from executor.model.safetensors_io import SafetensorsFile, write_safetensors
from executor.model.testing import forward_prompts, tiny_config
from executor.weights import (
    INDEX_FILE,
    export_hf_state_dict,
    hf_parameter_map,
    load_safetensors,
    random_weights,
    save_safetensors,
)

PROMPTS = [[1, 2, 3, 4, 5], [300, 20, 7]]


def _model(seed: int = 0, **overrides) -> CausalLM:
    model = CausalLM(tiny_config("qwen2", **overrides))
    random_weights(model, seed, std=0.2)
    return model


def _logits(model: CausalLM) -> torch.Tensor:
    caches = [DenseKVCache(model.config.num_layers) for _ in PROMPTS]
    return forward_prompts(model, PROMPTS, caches)


def _state(model: CausalLM) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_round_trip_gives_identical_logits(tmp_path: Path, tied: bool) -> None:
    src = _model(tie_word_embeddings=tied)
    save_safetensors(src, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == src.config.to_hf_config()
    dst = CausalLM(src.config)
    load_safetensors(dst, tmp_path)
    assert torch.equal(_logits(dst), _logits(src))
    names = SafetensorsFile(tmp_path / "model.safetensors").names()
    assert ("lm_head.weight" in names) != tied


def test_sharded_checkpoint(tmp_path: Path) -> None:
    src = _model(seed=4)
    files = save_safetensors(src, tmp_path, max_shard_bytes=60_000)
    assert len(files) > 2
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(hf_parameter_map(src.config))
    dst = CausalLM(src.config)
    load_safetensors(dst, tmp_path)
    assert torch.equal(_logits(dst), _logits(src))
    save_safetensors(src, tmp_path)  # a single file replaces the index
    assert not (tmp_path / INDEX_FILE).exists()


def test_bf16_checkpoint_loads_into_fp32_model(tmp_path: Path) -> None:
    src = _model().to(torch.bfloat16)
    save_safetensors(src, tmp_path)
    assert (
        SafetensorsFile(tmp_path / "model.safetensors").dtype("model.norm.weight") == torch.bfloat16
    )
    dst = CausalLM(src.config)  # fp32, the config's dtype
    load_safetensors(dst, tmp_path)
    for name, p in dst.named_parameters():
        assert torch.equal(p, dict(src.named_parameters())[name].float()), name


def _write(tmp_path: Path, state: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, state)
    return path


def test_missing_tensor_named_and_model_unchanged(tmp_path: Path) -> None:
    state = export_hf_state_dict(_model(seed=1))
    del state["model.layers.1.self_attn.k_proj.bias"]
    dst = _model(seed=2)
    before = _state(dst)
    with pytest.raises(ValueError, match=r"lacks.*model\.layers\.1\.self_attn\.k_proj\.bias"):
        load_safetensors(dst, _write(tmp_path, state))
    assert all(torch.equal(v, before[k]) for k, v in dst.state_dict().items())


def test_unexpected_tensor_named(tmp_path: Path) -> None:
    state = export_hf_state_dict(_model())
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.0\.mlp\.extra\.weight"):
        load_safetensors(CausalLM(tiny_config("qwen2")), _write(tmp_path, state))


def test_wrong_shape_named(tmp_path: Path) -> None:
    state = export_hf_state_dict(_model())
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(160, 63)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\[160, 63\]"):
        load_safetensors(CausalLM(tiny_config("qwen2")), _write(tmp_path, state))


def test_tied_model_ignores_checkpoint_lm_head_and_inv_freq(tmp_path: Path) -> None:
    src = _model(tie_word_embeddings=True)
    state = dict(export_hf_state_dict(src))
    state["lm_head.weight"] = src.embed_tokens.weight.detach().clone()
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    dst = CausalLM(src.config)
    load_safetensors(dst, _write(tmp_path, state))
    assert torch.equal(_logits(dst), _logits(src))


def test_index_pointing_at_wrong_shard_is_named(tmp_path: Path) -> None:
    save_safetensors(_model(), tmp_path, max_shard_bytes=60_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    name = "model.norm.weight"
    others = sorted(set(index["weight_map"].values()) - {index["weight_map"][name]})
    index["weight_map"][name] = others[0]
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_safetensors(CausalLM(tiny_config("qwen2")), tmp_path)


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model.safetensors"):
        load_safetensors(CausalLM(tiny_config("qwen2")), tmp_path)


def test_random_weights_deterministic_per_seed() -> None:
    a, b, c = _model(seed=7), _model(seed=7), _model(seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    norm = a.layers[0].input_layernorm.weight
    assert torch.equal(norm, torch.ones_like(norm))
    w = CausalLM(tiny_config("qwen2", hidden_size=128, intermediate_size=256))
    random_weights(w, 0)
    assert w.layers[0].mlp.gate_up_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_random_weights_same_values_in_bf16() -> None:
    config = tiny_config("qwen2")
    fp32, bf16 = CausalLM(config), CausalLM(config, dtype=torch.bfloat16)
    random_weights(fp32, 3)
    random_weights(bf16, 3)
    for (name, a), b in zip(fp32.named_parameters(), bf16.parameters()):
        assert b.dtype == torch.bfloat16
        assert torch.equal(a.to(torch.bfloat16), b), name


def test_format_interoperates_with_safetensors_package(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensors = {
        "a": torch.randn(3, 5, dtype=torch.bfloat16),
        "b": torch.arange(7, dtype=torch.int64),
        "c": torch.randn(2, dtype=torch.float16),
        "d": torch.randn(4, 1),
    }
    write_safetensors(tmp_path / "ours.safetensors", tensors)
    theirs = st.load_file(tmp_path / "ours.safetensors")
    assert set(theirs) == set(tensors) and all(torch.equal(theirs[k], tensors[k]) for k in tensors)
    st.save_file(tensors, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    f = SafetensorsFile(tmp_path / "theirs.safetensors")
    assert f.metadata == {"format": "pt"}
    assert all(torch.equal(f.get(k), tensors[k]) for k in tensors)


def test_truncated_file_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, {"w": torch.zeros(100)})
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"'w'"):
        SafetensorsFile(path)
