"""What the executor's decoder needs from a HF ``config.json`` (Llama / Qwen2 families)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from horizon.model_shape import ModelShape

MODEL_TYPES = ("llama", "qwen2")
DTYPES = ("float32", "bfloat16", "float16")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1-style ("llama3") RoPE frequency scaling; the only scaling supported."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ValueError(f"unsupported rope_scaling type {self.rope_type!r}; known: llama3")
        if not self.high_freq_factor > self.low_freq_factor > 0 or self.factor <= 0:
            raise ValueError(f"bad llama3 rope_scaling values: {self}")

    @classmethod
    def from_hf(cls, d: dict[str, Any] | None) -> RopeScaling | None:
        """``None`` for no scaling (absent, null or ``rope_type: default``)."""
        if not d:
            return None
        kind = d.get("rope_type", d.get("type", "default"))
        if kind == "default":
            return None
        if kind != "llama3":
            raise ValueError(f"unsupported rope_scaling type {kind!r}; known: default, llama3")
        try:
            return cls(
                factor=float(d["factor"]),
                low_freq_factor=float(d["low_freq_factor"]),
                high_freq_factor=float(d["high_freq_factor"]),
                original_max_position_embeddings=int(d["original_max_position_embeddings"]),
            )
        except KeyError as e:
            raise ValueError(f"rope_scaling lacks field {e.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "rope_type": self.rope_type,
        }


@dataclass(frozen=True)
class ModelConfig:
    """A Llama/Qwen2 decoder's architecture: the dimensions (a ``ModelShape``) plus what the
    forward pass needs beyond them. Build with ``from_hf_config`` or ``for_preset``."""

    shape: ModelShape
    model_type: str
    dtype: str = "bfloat16"
    rope_scaling: RopeScaling | None = None
    o_proj_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; known: {', '.join(MODEL_TYPES)}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        if self.shape.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.shape.head_dim}")

    # Dimensions, forwarded from the shape.
    name = property(lambda self: self.shape.name)
    num_layers = property(lambda self: self.shape.num_layers)
    hidden_size = property(lambda self: self.shape.hidden_size)
    num_heads = property(lambda self: self.shape.num_heads)
    num_kv_heads = property(lambda self: self.shape.num_kv_heads)
    head_dim = property(lambda self: self.shape.head_dim)
    intermediate_size = property(lambda self: self.shape.intermediate_size)
    vocab_size = property(lambda self: self.shape.vocab_size)
    max_position_embeddings = property(lambda self: self.shape.max_position_embeddings)
    tie_word_embeddings = property(lambda self: self.shape.tie_word_embeddings)
    qkv_bias = property(lambda self: self.shape.qkv_bias)
    rope_theta = property(lambda self: self.shape.rope_theta)
    rms_norm_eps = property(lambda self: self.shape.rms_norm_eps)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """Softmax scale an attention implementation must use: ``head_dim ** -0.5``."""
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def torch_dtype(self):  # -> torch.dtype; torch is imported lazily to keep this module light
        import torch

        return getattr(torch, self.dtype)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str | None = None) -> ModelConfig:
        """From a HF ``config.json`` dict (transformers 4.x or 5.x layout).

        Raises ValueError naming a missing field or an unsupported feature (model type,
        activation, sliding window, MLP bias, RoPE scaling other than llama3).
        """
        cfg = _normalise_rope(cfg)
        model_type = cfg.get("model_type")
        if model_type is None:
            raise ValueError("model config lacks field 'model_type'")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}; known: silu")
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window: true) is unsupported")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias: true is unsupported")
        name = name or cfg.get("_name_or_path") or str(model_type)
        shape = ModelShape.from_hf_config(name, cfg)
        eos = cfg.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            shape=shape,
            model_type=model_type,
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            rope_scaling=RopeScaling.from_hf(cfg.get("rope_scaling")),
            o_proj_bias=model_type == "llama" and bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def for_preset(cls, name: str) -> ModelConfig:
        """One of ``preset_names()``; unknown names raise ValueError listing the known ones."""
        return cls.from_hf_config(hf_config_for_preset(name), name=name)

    def with_dtype(self, dtype: str) -> ModelConfig:
        return dataclasses.replace(self, dtype=dtype)

    def to_hf_config(self) -> dict[str, Any]:
        """A HF ``config.json`` dict (transformers-4.x layout, which 5.x also reads)."""
        s = self.shape
        d: dict[str, Any] = {
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "hidden_act": "silu",
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads,
            "head_dim": s.head_dim,
            "vocab_size": s.vocab_size,
            "max_position_embeddings": s.max_position_embeddings,
            "rms_norm_eps": s.rms_norm_eps,
            "rope_theta": s.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "tie_word_embeddings": s.tie_word_embeddings,
            "torch_dtype": self.dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": _eos_to_hf(self.eos_token_ids),
        }
        if self.model_type == "llama":
            d["attention_bias"] = s.qkv_bias
            d["mlp_bias"] = False
            if s.qkv_bias != self.o_proj_bias:
                raise ValueError("a llama config has q/k/v and o_proj bias together or neither")
        else:
            d["use_sliding_window"] = False
            if not s.qkv_bias or self.o_proj_bias:
                raise ValueError("a qwen2 config has q/k/v bias and no o_proj bias")
        return d


def _eos_to_hf(ids: tuple[int, ...]) -> int | list[int] | None:
    return None if not ids else ids[0] if len(ids) == 1 else list(ids)


def _normalise_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers 5.x writes ``rope_parameters: {rope_type, rope_theta, ...}`` instead of
    ``rope_theta`` + ``rope_scaling``; fold it back into the 4.x fields."""
    params = cfg.get("rope_parameters")
    if not params:
        return cfg
    if "full_attention" in params:  # per-layer-type parameters; all our layers are full
        params = params["full_attention"]
    cfg = dict(cfg)
    if "rope_theta" in params:
        cfg["rope_theta"] = params["rope_theta"]
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta",)}
    if scaling.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = scaling
    return cfg


# Published config.json values (the Instruct checkpoints, which are what one serves; their
# shapes equal the base models'; horizon.model_shape's presets describe the same models).
_PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128009,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
    },
}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def hf_config_for_preset(name: str) -> dict[str, Any]:
    """A fresh copy of a preset's HF ``config.json`` dict."""
    try:
        return copy.deepcopy(_PRESETS[name])
    except KeyError:
        raise ValueError(
            f"unknown model preset {name!r}; known: {', '.join(preset_names())}"
        ) from None
