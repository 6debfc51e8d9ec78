"""The contract between the decoder and whatever attends (paged kernels, or a dense reference)."""

from __future__ import annotations

from typing import Protocol

import torch


class Attention(Protocol):
    """Called once per layer per forward pass, with that layer's new tokens.

    The decoder runs on a flat batch of ``T`` tokens (several sequences' tokens back to back, no
    padding). What the tokens are, where their keys and values go and what each may attend to
    (sequence boundaries, context lengths, block tables) is the implementation's state, set up
    by its owner before ``model.forward`` and left unchanged during it.

    Args:
        layer_idx: ``0 .. num_layers - 1``, in increasing order within one forward pass.
        q: ``[T, num_heads, head_dim]``, RoPE applied.
        k: ``[T, num_kv_heads, head_dim]``, RoPE applied.
        v: ``[T, num_kv_heads, head_dim]``; a strided view of the fused QKV projection output
            (last dim contiguous, token stride ``q_size + 2 * kv_size``).
        All three share the model's dtype and device.

    Returns:
        ``[T, num_heads, head_dim]`` in ``q``'s dtype (any strides): for each token, softmax
        attention with scale ``config.attention_scale`` (``head_dim ** -0.5``) over its sequence's
        earlier keys and its own (causal), query head ``h`` using KV head
        ``h // (num_heads // num_kv_heads)``.

    An implementation typically stores ``k`` and ``v`` in its cache (mutating it) before
    attending. It must not read values back to the host nor produce data-dependent shapes if
    the caller is to capture the forward in a CUDA graph.
    """

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...
