"""Building blocks of a Llama/Qwen2 decoder, on flat token batches ``[T, ...]``.

Numerics follow HF transformers' eager implementation (RMSNorm in fp32 then cast back,
neox-style rotate-half RoPE with cos/sin cast to the activation dtype), so that logits match
it to rounding in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .config import ModelConfig, RopeScaling


class Linear(nn.Linear):
    """``nn.Linear`` created as zeros: values come from a checkpoint or ``random_weights``."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class Embedding(nn.Embedding):
    """``nn.Embedding`` created as zeros (see ``Linear``)."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """``[head_dim / 2]`` fp32 inverse frequencies, as HF computes them (on the CPU)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    if scaling is None:
        return inv_freq
    # Llama 3.1: long wavelengths slowed down by `factor`, short ones kept, smooth in between.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin for every position below ``max_positions``, computed once in fp32 on the CPU
    (identical on every device), looked up by a ``positions`` tensor."""

    def __init__(self, config: ModelConfig, device=None) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        t = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [positions, head_dim]
        self.register_buffer("cos_sin_cache", cache.to(device), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """``(cos, sin)``, each ``[T, 1, head_dim / 2]`` in ``dtype``."""
        cos_sin = self.cos_sin_cache.index_select(0, positions).to(dtype)
        cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of ``x`` ``[T, heads, head_dim]`` (HF's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class SelfAttention(nn.Module):
    """Fused QKV projection, RoPE, injected attention, output projection."""

    def __init__(self, config: ModelConfig, layer_idx: int, device=None, dtype=None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        h, qkv = config.hidden_size, config.q_size + 2 * config.kv_size
        kw = {"device": device, "dtype": dtype}
        self.qkv_proj = Linear(h, qkv, bias=config.qkv_bias, **kw)
        self.o_proj = Linear(config.q_size, h, bias=config.o_proj_bias, **kw)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        o = attention(self.layer_idx, q, k, v)
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one projection (``[gate; up]`` rows)."""

    def __init__(self, config: ModelConfig, device=None, dtype=None) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(h, 2 * i, bias=False, device=device, dtype=dtype)
        self.down_proj = Linear(i, h, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, device=None, dtype=None) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.self_attn = SelfAttention(config, layer_idx, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.mlp = MLP(config, device, dtype)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention)
        return x + self.mlp(self.post_attention_layernorm(x))
