"""A Llama/Qwen2 causal LM on flat token batches, with attention injected by the caller."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .config import ModelConfig
from .layers import DecoderLayer, Embedding, Linear, RMSNorm, RotaryEmbedding


class CausalLM(nn.Module):
    """Embedding, ``num_layers`` decoder layers, final norm, LM head (tied to the embedding when
    the config says so).

    Parameters are created as zeros (norm weights as ones) in ``dtype`` (default: the config's)
    on ``device``; fill them with ``executor.weights.load_safetensors`` or ``random_weights``.
    Parameter names follow HF's minus the ``model.`` prefix, except for the fused
    ``self_attn.qkv_proj`` (rows ``[q; k; v]``) and ``mlp.gate_up_proj`` (rows ``[gate; up]``).

    ``forward`` has no host synchronisation, Python loop over tokens or data-dependent shape,
    so a decode step can be captured in a CUDA graph (given a capturable ``Attention``).
    """

    def __init__(self, config: ModelConfig, device=None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        dtype = dtype or config.torch_dtype
        kw = {"device": device, "dtype": dtype}
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(DecoderLayer(config, i, **kw) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False, **kw)
        )
        self.rotary = RotaryEmbedding(config, device=device)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        """Hidden states after the final norm.

        Args:
            input_ids: ``[T]`` int64 token ids of a flat batch (sequences back to back).
            positions: ``[T]`` int64, each token's position in its sequence
                (``< max_position_embeddings``).
            attention: called once per layer (see ``Attention``); typically mutates its cache.

        Returns:
            ``[T, hidden_size]`` in the model's dtype.
        """
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, attention)
        return self.norm(h)

    def greedy_tokens(self, hidden: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """The argmax token of each of ``hidden[rows]`` (int32; capturable)."""
        return F.linear(hidden[rows], self.lm_head_weight).argmax(-1).to(torch.int32)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, hidden_size]`` rows (e.g. each sequence's last token) -> ``[N, vocab]`` fp32."""
        return F.linear(hidden, self.lm_head_weight).float()
