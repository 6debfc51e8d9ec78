"""Shapes of Llama/Qwen2-style decoders: what step cost depends on (not weight values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """A decoder's dimensions, as in a HF ``config.json``."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for f in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelShape.{f} must be an int >= 1, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelShape.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )

    @property
    def params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * (q + 2 * kv) + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate_size
        return attn + mlp + 2 * h

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else emb
        return self.num_layers * self.params_per_layer + emb + head + self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters multiplied per token (layers + LM head; the embedding is a gather)."""
        return self.num_layers * self.params_per_layer + self.vocab_size * self.hidden_size

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def kv_blocks(
        self, memory_bytes: float, utilization: float, block_size: int, dtype_bytes: int = 2
    ) -> int:
        """KV blocks that fit in ``utilization`` of ``memory_bytes`` after the weights."""
        if not 0 < utilization <= 1:
            raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
        free = memory_bytes * utilization - self.weight_bytes(dtype_bytes)
        blocks = int(free // (block_size * self.kv_bytes_per_token(dtype_bytes)))
        if blocks < 1:
            raise ValueError(
                f"{self.name}: no room for KV blocks in {memory_bytes / 2**30:.1f} GiB at "
                f"utilization {utilization} (weights take "
                f"{self.weight_bytes(dtype_bytes) / 2**30:.1f} GiB)"
            )
        return blocks

    @classmethod
    def from_hf_config(cls, name: str, cfg: dict[str, Any]) -> ModelShape:
        """From a HF ``config.json`` dict of a Llama/Qwen2 model."""
        try:
            heads = cfg["num_attention_heads"]
            return cls(
                name=name,
                num_layers=cfg["num_hidden_layers"],
                hidden_size=cfg["hidden_size"],
                num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads", heads),
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                intermediate_size=cfg["intermediate_size"],
                vocab_size=cfg["vocab_size"],
                max_position_embeddings=cfg["max_position_embeddings"],
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias")),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            )
        except KeyError as e:
            raise ValueError(f"model config {name!r} lacks field {e.args[0]!r}") from None


_PRESETS = {
    "qwen2.5-0.5b": ModelShape(
        "qwen2.5-0.5b",
        24,
        896,
        14,
        2,
        64,
        4864,
        151936,
        32768,
        tie_word_embeddings=True,
        qkv_bias=True,
        rope_theta=1e6,
    ),
    "qwen2.5-7b": ModelShape(
        "qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, qkv_bias=True, rope_theta=1e6
    ),
    "llama-3-8b": ModelShape(
        "llama-3-8b",
        32,
        4096,
        32,
        8,
        128,
        14336,
        128256,
        8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
    ),
}


def model_shape_names() -> list[str]:
    return sorted(_PRESETS)


def model_shape(name: str) -> ModelShape:
    """A named preset shape; unknown names raise ValueError listing the known ones."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown model shape {name!r}; known: {', '.join(model_shape_names())}"
        ) from None
