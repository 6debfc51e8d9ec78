"""Torch references for the KV write and both paged attentions.

They are the ground truth the Triton kernels are tested against, and the engine's CPU backend.
Attention is computed in fp32 per sequence (a Python loop over sequences, reading lengths on the
host), so these are simple rather than fast. Shapes and layout as in ``executor.kernels``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[T, kv_heads, dim]`` into the caches at ``slot_mapping[T]``.

    A slot is ``block * block_size + offset``; -1 skips the token. Mutates ``k_cache``/``v_cache``.
    """
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """One sequence's first ``context_len`` tokens ``[context_len, kv_heads, dim]`` of ``cache``."""
    block_size = cache.shape[1]
    pos = torch.arange(context_len, device=cache.device)
    blocks = block_table[pos // block_size].long()
    return cache[blocks, pos % block_size]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float
) -> torch.Tensor:
    """q [Lq, H, D] at positions [prefix_len, prefix_len + Lq); k, v [Lk, Hkv, D]; fp32 out."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)  # [H, Lq, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    q_pos = prefix_len + torch.arange(q.shape[0], device=q.device)
    mask = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def paged_prefill_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged causal attention over paged context; see ``kernels.paged_prefill_attention``."""
    if out is None:
        out = torch.empty_like(q)
    cu = cu_q_lens.tolist()
    ctx = context_lens.tolist()
    for i, context_len in enumerate(ctx):
        lo, hi = cu[i], cu[i + 1]
        if hi == lo:
            continue
        if context_len == 0:  # a padding sequence
            out[lo:hi] = 0
            continue
        k = gather_kv(k_cache, block_tables[i], context_len)
        v = gather_kv(v_cache, block_tables[i], context_len)
        out[lo:hi] = _attend(q[lo:hi], k, v, context_len - (hi - lo), scale).to(out.dtype)
    return out


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence; see ``executor.kernels.paged_decode_attention``."""
    cu_q_lens = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention_torch(
        q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale, out
    )
