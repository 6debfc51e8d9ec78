"""A llama.cpp GGUF file (Llama family) as ``executor.model.CausalLM`` weights and config.

Two conventions of the format, undone here so the model sees HF's layout (``hf_parameter_map``):

* Dimensions are stored innermost first: the reader's ``tensor.shape`` is ggml's ``ne``
  (``[in, out]`` for a weight), while ``tensor.data`` / ``gguf.quants.dequantize`` give the
  row-major numpy array, ``[out, in]`` as in HF.
* llama.cpp's converter permutes the rows of each Llama Q and K projection for its RoPE
  (``LlamaModel.permute``: per head, the two halves that HF's ``rotate_half`` pairs are
  interleaved); ``unpermute_rope_rows`` restores HF's order.

Quantized tensors are dequantized (``gguf.quants``) to fp32, then cast to the model's dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from executor.model.config import ModelConfig
from executor.model.decoder import CausalLM
from executor.weights import Target, hf_parameter_map

ARCHITECTURES = ("llama",)
_INSTALL = "reading GGUF files needs the gguf package: pip install 'gguf>=0.10'"

# GGUF tensor stem -> HF name after ``model.layers.{n}.`` (blocks) or whole (the rest).
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def open_gguf(path: str | Path):  # -> gguf.GGUFReader
    """A memory-mapped reader of ``path``. Raises ImportError naming the pip command when the
    ``gguf`` package is missing, ValueError when the file is not GGUF."""
    try:
        import gguf
    except ImportError:
        raise ImportError(_INSTALL) from None
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, AssertionError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from None


def read_gguf_metadata(reader) -> dict[str, Any]:  # noqa: ANN001
    """Every metadata field of ``reader`` by key: scalars as Python values, strings decoded,
    arrays as lists (49k-token vocabularies take ~0.1 s). Nested arrays are left out."""
    from gguf import GGUFValueType

    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        kind = field.types[0] if field.types else None
        if kind == GGUFValueType.STRING:
            meta[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        elif kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.ARRAY:
                continue
            if sub == GGUFValueType.STRING:
                meta[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                parts = [field.parts[i] for i in field.data]
                meta[key] = np.concatenate(parts).tolist() if parts else []
        elif kind is not None and field.data:
            meta[key] = field.parts[field.data[0]].tolist()[0]
    return meta


def hf_config_from_gguf(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A HF ``config.json`` dict of the Llama model a GGUF file describes (``meta`` from
    ``read_gguf_metadata``, ``tensor_names`` its tensors' names).

    Raises ValueError naming the field for a missing required key, an architecture other
    than llama, or a feature the decoder lacks (RoPE scaling, partial rotary, MoE, per-layer
    head counts).
    """
    arch = meta.get("general.architecture")
    if arch is None:
        raise ValueError("GGUF metadata lacks field 'general.architecture'")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF general.architecture {arch!r} is unsupported; known: {', '.join(ARCHITECTURES)}"
        )
    _check_supported(meta, arch)

    def need(suffix: str) -> Any:
        key = f"{arch}.{suffix}"
        if key not in meta:
            raise ValueError(f"GGUF metadata lacks field {key!r}")
        value = meta[key]
        if isinstance(value, list):
            raise ValueError(f"GGUF field {key!r} is per-layer ({value[:4]}...); unsupported")
        return value

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"GGUF field '{arch}.rope.dimension_count' = {rotary} (partial rotary) is "
            f"unsupported; head_dim is {head_dim}"
        )
    vocab = meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))
    if not vocab:
        raise ValueError(f"GGUF metadata lacks field '{arch}.vocab_size'")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": int(need("block_count")),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "rope_theta": _f32(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": _f32(need("attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": None if eos is None else int(eos),
    }


def _check_supported(meta: dict[str, Any], arch: str) -> None:
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"GGUF field '{arch}.rope.scaling.type' = {scaling!r} is unsupported")
    if meta.get(f"{arch}.expert_count", 0):
        raise ValueError(f"GGUF field '{arch}.expert_count' > 0 (experts) is unsupported")
    key_len = meta.get(f"{arch}.attention.key_length")
    value_len = meta.get(f"{arch}.attention.value_length", key_len)
    if value_len != key_len:
        raise ValueError(
            f"GGUF field '{arch}.attention.value_length' = {value_len} differs from key_length "
            f"{key_len}; unsupported"
        )


def _f32(x: float) -> float:
    """GGUF stores floats as fp32; take the shortest decimal that rounds to it (9.9999997e-06
    -> 1e-05), i.e. the value the converter was given."""
    return float(str(np.float32(x)))


def model_config_from_gguf(
    reader,  # noqa: ANN001
    dtype: str = "float32",
    name: str | None = None,
    meta: dict[str, Any] | None = None,
) -> ModelConfig:
    """The ``ModelConfig`` of an open GGUF file (see ``hf_config_from_gguf``) in ``dtype``,
    built through ``ModelConfig.from_hf_config`` so it is checked like any HF config.
    ``meta``: the file's ``read_gguf_metadata``, when the caller has it already; ``name``
    defaults to the file's ``general.name``."""
    meta = read_gguf_metadata(reader) if meta is None else meta
    hf = hf_config_from_gguf(meta, {t.name for t in reader.tensors})
    hf["torch_dtype"] = dtype
    return ModelConfig.from_hf_config(hf, name=name or meta.get("general.name") or "gguf")


def gguf_parameter_map(config: ModelConfig) -> dict[str, tuple[str, Target]]:
    """GGUF tensor name -> (HF name, place in ``CausalLM``), for every tensor a file of
    ``config`` must hold (``output.weight`` only when embeddings are untied)."""
    hf_to_target = hf_parameter_map(config)
    out: dict[str, tuple[str, Target]] = {}
    for gguf_name, hf_name in _TOP_NAMES.items():
        if hf_name in hf_to_target:
            out[gguf_name] = (hf_name, hf_to_target[hf_name])
    for n in range(config.num_layers):
        for stem, hf_stem in _BLOCK_NAMES.items():
            hf_name = f"model.layers.{n}.{hf_stem}"
            if hf_name in hf_to_target:
                out[f"blk.{n}.{stem}"] = (hf_name, hf_to_target[hf_name])
    return out


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute(w, n_head, n_head_kv)`` of a Q or K weight (or bias):
    within each head, row ``2 i + j`` of the file is HF's row ``j * head_dim / 2 + i``."""
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(model: CausalLM, reader) -> None:  # noqa: ANN001
    """Copy an open GGUF file's tensors into ``model`` (dequantized, Q/K un-permuted, cast to
    the model's dtype and device).

    Everything is checked before anything is copied: a missing or unexpected tensor, or one
    whose shape differs from the model's, raises ValueError naming it and leaves the model
    unchanged.
    """
    from gguf.quants import dequantize

    config = model.config
    mapping = gguf_parameter_map(config)
    tensors = {t.name: t for t in reader.tensors}
    unexpected = sorted(set(tensors) - set(mapping))
    if unexpected:
        raise ValueError(f"unexpected tensors in GGUF file: {', '.join(unexpected[:8])}")
    missing = [n for n in mapping if n not in tensors]
    if missing:
        raise ValueError(f"GGUF file lacks tensors: {', '.join(missing[:8])}")
    params = dict(model.named_parameters())
    for name, (_, target) in mapping.items():
        shape = tuple(int(d) for d in reversed(tensors[name].shape.tolist()))
        want = tuple(target.view(params[target.param]).shape)
        if shape != want:
            raise ValueError(f"GGUF tensor {name!r} has shape {list(shape)}, expected {list(want)}")
    with torch.no_grad():
        for name, (_, target) in mapping.items():
            t = tensors[name]
            w = torch.from_numpy(np.require(dequantize(t.data, t.tensor_type), requirements="CW"))
            w = w.reshape(target.view(params[target.param]).shape)
            if ".attn_q." in name:
                w = unpermute_rope_rows(w, config.num_heads)
            elif ".attn_k." in name:
                w = unpermute_rope_rows(w, config.num_kv_heads)
            target.view(params[target.param]).copy_(w)


def load_gguf_model(
    path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu"
) -> CausalLM:
    """A ``CausalLM`` of the GGUF file at ``path``, weights loaded, in ``dtype`` on ``device``."""
    reader = open_gguf(path)
    config = model_config_from_gguf(reader, dtype=dtype)
    model = CausalLM(config, device=device)
    load_gguf(model, reader)
    return model.eval()
