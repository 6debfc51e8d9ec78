"""Reference ``Attention``: per-sequence causal attention over contiguous per-sequence caches.

For tests and CPU runs; it loops over sequences in Python and grows its caches with
``torch.cat``, so it is neither fast nor capturable in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DenseKVCache:
    """One sequence's past keys and values: per layer, ``[tokens, num_kv_heads, head_dim]``."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        """Tokens cached by completed forward passes (the last layer is written last)."""
        k = self.keys[-1]
        return 0 if k is None else k.shape[0]

    def append(
        self, layer_idx: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new tokens' ``k``, ``v`` to a layer; return the layer's whole keys and values."""
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is not None and old_v is not None:
            k, v = torch.cat([old_k, k]), torch.cat([old_v, v])
        self.keys[layer_idx], self.values[layer_idx] = k.contiguous(), v.contiguous()
        return k, v


class DenseAttention:
    """Attention for one forward pass over a flat batch made of consecutive runs of tokens, run
    ``i`` being the next ``query_lens[i]`` tokens of the sequence whose past is ``caches[i]``.

    Each call appends the run's keys and values to its cache (**mutates** ``caches``) and
    attends causally over the cache. Scores and softmax are in fp32; the output has q's dtype.
    """

    def __init__(
        self,
        query_lens: Sequence[int],
        caches: Sequence[DenseKVCache],
        scale: float | None = None,
    ) -> None:
        if len(query_lens) != len(caches):
            raise ValueError(f"{len(query_lens)} query lengths for {len(caches)} caches")
        if any(n < 1 for n in query_lens):
            raise ValueError(f"query lengths must be >= 1, got {list(query_lens)}")
        self.query_lens = list(query_lens)
        self.caches = list(caches)
        self.scale = scale

    def __call__(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if q.shape[0] != sum(self.query_lens):
            raise ValueError(
                f"{q.shape[0]} tokens, but query lengths sum to {sum(self.query_lens)}"
            )
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        out = torch.empty_like(q)
        start = 0
        for n, cache in zip(self.query_lens, self.caches):
            rows = slice(start, start + n)
            keys, values = cache.append(layer_idx, k[rows], v[rows])
            out[rows] = causal_attention(q[rows], keys, values, scale)
            start += n
        return out


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """The last ``n`` of ``L`` tokens of one sequence attending to all ``L`` causally.

    ``q``: ``[n, heads, d]``; ``k``, ``v``: ``[L, kv_heads, d]`` with ``L >= n``.
    """
    n, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    query_pos = torch.arange(length - n, length, device=q.device)
    future = torch.arange(length, device=q.device)[None, :] > query_pos[:, None]
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
