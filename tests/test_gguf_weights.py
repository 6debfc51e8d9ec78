"""GGUF files in and out of the decoder: a tiny Llama written the way llama.cpp's converter
writes one (Q/K rows permuted, dims reversed) loads back bit-identical, and the config reader
names what it cannot use."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from executor.gguf_weights import (
    gguf_parameter_map,
    hf_config_from_gguf,
    load_gguf,
    load_gguf_model,
    open_gguf,
    unpermute_rope_rows,
)
from executor.model import CausalLM, DenseKVCache
from executor.model.testing import forward_prompts, tiny_config
from executor.weights import random_weights

gguf = pytest.importorskip("gguf", reason="reading GGUF files needs gguf")

META = {
    "general.architecture": "llama",
    "llama.block_count": 2,
    "llama.context_length": 256,
    "llama.embedding_length": 64,
    "llama.feed_forward_length": 160,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.vocab_size": 512,
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """``convert_hf_to_gguf.LlamaModel.permute`` (HF rows -> llama.cpp's RoPE layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for heads in (8, 2):
        back = unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(w, heads)), heads)
        assert torch.equal(back, torch.from_numpy(w))
    bias = np.arange(64, dtype=np.float32)
    assert torch.equal(
        unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(bias, 4)), 4), torch.from_numpy(bias)
    )


def write_tiny_gguf(path, model: CausalLM) -> None:  # noqa: ANN001
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_heads)
    w.add_head_count_kv(c.num_kv_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    params = dict(model.named_parameters())
    for name, (_, target) in gguf_parameter_map(c).items():
        t = target.view(params[target.param]).detach().numpy().copy()
        if ".attn_q." in name:
            t = llama_cpp_permute(t, c.num_heads)
        elif ".attn_k." in name:
            t = llama_cpp_permute(t, c.num_kv_heads)
        w.add_tensor(name, t.astype(np.float16) if "ffn_down" in name else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_llama_round_trip(tmp_path) -> None:
    config = tiny_config("llama", num_key_value_heads=2, rms_norm_eps=1e-5)
    model = CausalLM(config)
    random_weights(model, seed=0, std=0.2)
    with torch.no_grad():  # ffn_down goes through fp16 in the file
        for layer in model.layers:
            layer.mlp.down_proj.weight.copy_(layer.mlp.down_proj.weight.half().float())
    write_tiny_gguf(tmp_path / "tiny.gguf", model)
    loaded = load_gguf_model(tmp_path / "tiny.gguf", dtype="float32")
    assert dataclasses.replace(loaded.config.shape, name=config.name) == config.shape
    for (name, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), name
    prompt = [[5, 17, 300, 2, 41, 99]]
    want = forward_prompts(model, prompt, [DenseKVCache(2)])
    torch.testing.assert_close(
        forward_prompts(loaded, prompt, [DenseKVCache(2)]), want, rtol=0, atol=0
    )


def test_missing_tensor_is_named_and_model_unchanged(tmp_path) -> None:
    model = CausalLM(tiny_config("llama", num_key_value_heads=2))
    random_weights(model, seed=1)
    write_tiny_gguf(tmp_path / "tiny.gguf", model)
    deeper = CausalLM(tiny_config("llama", num_key_value_heads=2, num_hidden_layers=3))
    with pytest.raises(ValueError, match="lacks tensors: blk.2."):
        load_gguf(deeper, open_gguf(tmp_path / "tiny.gguf"))
    assert not deeper.embed_tokens.weight.any()  # nothing was copied


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"general.architecture": "qwen2"}, "general.architecture 'qwen2' is unsupported"),
        ({"llama.block_count": None}, "lacks field 'llama.block_count'"),
        ({"llama.rope.scaling.type": "linear"}, "'llama.rope.scaling.type' = 'linear'"),
        ({"llama.rope.dimension_count": 8}, "partial rotary"),
        ({"llama.attention.head_count": [4, 4]}, "'llama.attention.head_count' is per-layer"),
    ],
)
def test_config_errors_name_the_field(change: dict, message: str) -> None:
    meta = {k: v for k, v in {**META, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hf_config_from_gguf(meta, {"token_embd.weight"})


def test_config_reads_tied_embeddings_from_tensors() -> None:
    assert hf_config_from_gguf(META, {"token_embd.weight"})["tie_word_embeddings"]
    assert not hf_config_from_gguf(META, {"token_embd.weight", "output.weight"})[
        "tie_word_embeddings"
    ]
    assert hf_config_from_gguf(META, set())["rms_norm_eps"] == 1e-5
