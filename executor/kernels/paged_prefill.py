"""Triton ragged attention over paged context: prefill chunks and decodes in one call.

Sequence ``i`` brings ``q_len_i`` query tokens (packed in ``q`` from ``cu_q_lens[i]``) at positions
``[ctx_i - q_len_i, ctx_i)``; their own K/V are already in the cache. Query ``j`` attends to every
cached token at position ``<= ctx_i - q_len_i + j``.

Grid ``(num_q_tiles, num_kv_heads)``. A tile is ``BLOCK_M`` rows = ``BLOCK_Q`` consecutive query
tokens x the KV head's query group (padded to a power of two), so one K/V tile read feeds the whole
group. Tile ``t`` of sequence ``i`` is program ``cu_q_lens[i] // BLOCK_Q + i + t``; that bound
gives every sequence enough tiles and makes the grid ``total_q // BLOCK_Q + num_seqs`` (host
sizes only: no read-back, graph-capturable). Each program finds its sequence by binary search over
``cu_q_lens``; spare programs exit at once. A sequence of context 0 is padding (a captured step's
spare tokens): its outputs are zeros.

The key loop has two phases: keys before the tile's first query position are visible to every row
(no mask), the rest up to the tile's last query position get the causal mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_decode import LOG2E
from .tiling import Tiles, next_pow2


@triton.jit
def _find_seq(cu_q_lens_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_q_lens_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_keys(
    acc,
    m,
    l_sum,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    table,
    head_off,
    key_lo,
    key_hi,
    block_size,
    stride_cb,
    stride_ct,
    d,
    d_mask,
    qk_scale,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    for n0 in range(key_lo, key_hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < key_hi
        block = tl.load(table + n // block_size, mask=n_mask, other=0).to(tl.int64)
        row = block * stride_cb + (n % block_size) * stride_ct + head_off
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if CAUSAL:
            s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        else:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        # Rows that see no key yet (padding rows) keep m at 0 so that no inf - inf appears.
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return acc, m, l_sum


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_q_lens_ptr,
    context_lens_ptr,
    out_ptr,
    qk_scale,
    num_seqs,
    block_size,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bts,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = _find_seq(cu_q_lens_ptr, tile, num_seqs, BLOCK_Q)
    q_begin = tl.load(cu_q_lens_ptr + seq)
    q_len = tl.load(cu_q_lens_ptr + seq + 1) - q_begin
    q0 = (tile - (q_begin // BLOCK_Q + seq)) * BLOCK_Q  # first query (local index) of the tile
    if q0 >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    prefix = ctx - q_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    qi = q0 + r // GROUP_PAD
    gi = r % GROUP_PAD
    row_mask = (qi < q_len) & (gi < GROUP)
    d_mask = d < HEAD_DIM
    heads = kvh * GROUP + gi
    tok = (q_begin + qi).to(tl.int64)
    io_mask = row_mask[:, None] & d_mask[None, :]
    o_ptr = out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    if ctx == 0:  # a padding sequence: its queries' outputs are zeros
        tl.store(
            o_ptr,
            tl.zeros([BLOCK_M, BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty),
            mask=io_mask,
        )
        return
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=io_mask,
        other=0.0,
    )
    q_pos = prefix + qi

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bts
    head_off = kvh * stride_ch
    # Keys [0, prefix + q0] are visible to every row; whole tiles of them need no mask.
    full_hi = ((prefix + q0 + 1) // BLOCK_N) * BLOCK_N
    last_hi = tl.minimum(prefix + q0 + BLOCK_Q, ctx)
    acc, m, l_sum = _attend_keys(
        acc, m, l_sum, q, q_pos, k_cache_ptr, v_cache_ptr, table, head_off, 0, full_hi,
        block_size, stride_cb, stride_ct, d, d_mask, qk_scale, BLOCK_N, False,
    )  # fmt: skip
    acc, m, l_sum = _attend_keys(
        acc, m, l_sum, q, q_pos, k_cache_ptr, v_cache_ptr, table, head_off, full_hi, last_hi,
        block_size, stride_cb, stride_ct, d, d_mask, qk_scale, BLOCK_N, True,
    )  # fmt: skip

    o = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    tiles: Tiles,
) -> torch.Tensor:
    """See ``executor.kernels.paged_prefill_attention``; arguments already checked."""
    total_q, num_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if total_q == 0 or num_seqs == 0:
        return out
    group_pad = next_pow2(group)
    block_m = max(tiles.block_m, 16, group_pad)
    block_q = block_m // group_pad
    grid = (total_q // block_q + num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_q_lens,
        context_lens,
        out,
        scale * LOG2E,
        num_seqs,
        k_cache.shape[1],
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_D=max(16, next_pow2(head_dim)),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
