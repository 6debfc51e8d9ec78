"""Triton paged decode attention: one query token per sequence, GQA, optional split-K.

Grid ``(num_seqs, num_kv_heads, num_splits)``. A program holds its KV head's whole query group
(``group`` heads, padded to 16 rows for ``tl.dot``) so each K/V row is read from memory once per
group, not once per query head. It walks its share of the context ``BLOCK_N`` tokens at a time,
gathering each token's row through the block table (so ``BLOCK_N`` need not equal the cache's
block size, and a tile may span several cache blocks), with an online softmax in base 2.

Split-K (flash-decoding): with few sequences, ``num_splits > 1`` cuts each context into equal
pieces (rounded to ``BLOCK_N``) computed by separate programs, which write fp32 partial outputs and
their log-sum-exp; a second kernel merges them. Piece boundaries are computed on the device from
each sequence's length, so the grid depends only on ``num_seqs`` and ``num_splits``: nothing is read
back to the host and the launch can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .tiling import Tiles, next_pow2

LOG2E = math.log2(math.e)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,
    num_splits,
    block_size,
    stride_qs,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bts,
    stride_os,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    ctx = tl.load(context_lens_ptr + seq)
    piece = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    start = split * piece
    end = tl.minimum(start + piece, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bts
    head_off = kvh * stride_ch
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        block = tl.load(table + n // block_size, mask=n_mask, other=0).to(tl.int64)
        row = block * stride_cb + (n % block_size) * stride_ct + head_off
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        # Every tile holds at least one valid key, and padded rows score 0: m_new is finite.
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    empty = l_sum == 0.0  # an empty split, or a padding sequence (context length 0)
    o = acc / tl.where(empty, 1.0, l_sum)[:, None]
    o_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        row_id = (seq * NUM_HEADS + heads) * num_splits + split
        tl.store(part_out_ptr + row_id[:, None] * HEAD_DIM + d[None, :], o, mask=o_mask)
        lse = tl.where(empty, float("-inf"), m + tl.log2(tl.where(empty, 1.0, l_sum)))
        tl.store(part_lse_ptr + row_id, lse, mask=g_mask)
    else:
        o_ptr = out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_os,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_splits
    d_mask = d < HEAD_DIM
    row_id = (seq * NUM_HEADS + head) * num_splits + s
    lse = tl.load(part_lse_ptr + row_id, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # all splits empty: weights 0, output 0
    w = tl.exp2(lse - top)
    total = tl.sum(w, 0)
    part = tl.load(
        part_out_ptr + row_id[:, None] * HEAD_DIM + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    o = tl.sum(part * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + d,
        o.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    num_splits: int,
    tiles: Tiles,
) -> torch.Tensor:
    """See ``executor.kernels.paged_decode_attention``; arguments already checked."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_seqs == 0:
        return out
    block_d = max(16, next_pow2(head_dim))
    block_g = max(tiles.block_m, next_pow2(group))
    split = num_splits > 1
    # the splits' partial outputs and log-sum-exps (unused, hence ``out``, without splits)
    part_out, part_lse = _partials(q, num_splits) if split else (out, out)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_out,
        part_lse,
        scale * LOG2E,
        num_splits,
        k_cache.shape[1],
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_G=block_g,
        BLOCK_D=block_d,
        BLOCK_N=tiles.block_n,
        SPLIT=split,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    if split:
        _merge_splits(part_out, part_lse, out, num_splits, block_d)
    return out


def _partials(q: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 buffers of each split's partial output and log-sum-exp, per sequence and head."""
    num_seqs, num_heads, head_dim = q.shape
    part_out = torch.empty(
        (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    return part_out, part_lse


def _merge_splits(
    part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, num_splits: int, block_d: int
) -> None:
    """Launch the kernel that merges the splits' partials into ``out``."""
    num_seqs, num_heads, _, head_dim = part_out.shape
    _merge_splits_kernel[(num_seqs, num_heads)](
        part_out,
        part_lse,
        out,
        num_splits,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_S=max(2, next_pow2(num_splits)),
        BLOCK_D=block_d,
        num_warps=4 if head_dim >= 128 else 2,
    )
