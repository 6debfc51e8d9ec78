"""The torch reference attentions against a naive dense float64 computation."""

from __future__ import annotations

import math

import pytest
import torch

from executor.kernels import paged_decode_attention, paged_prefill_attention
from executor.kernels.reference import gather_kv, write_kv_torch
from executor.kernels.testing import make_paged_case


def _naive(q, k, v, prefix_len, scale):
    """q [Lq, H, D], k/v [Lk, Hkv, D]; loops over heads and queries, float64."""
    lq, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(num_heads):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for j in range(lq):
            visible = prefix_len + j + 1
            s = kh[:visible] @ q[j, h].double() * scale
            p = torch.softmax(s, 0)
            out[j, h] = p @ vh[:visible]
    return out


@pytest.mark.parametrize("group", [1, 3, 8])
def test_prefill_reference_matches_naive(group):
    c = make_paged_case([21, 8, 40], [5, 1, 40], 2, group, 16, 8, torch.float32, seed=group)
    out = paged_prefill_attention(
        c.q,
        c.k_cache,
        c.v_cache,
        c.block_tables,
        c.cu_q_lens,
        c.context_lens,
        c.scale,
        backend="torch",
    )
    cu, ctx = c.cu_q_lens.tolist(), c.context_lens.tolist()
    for i, n in enumerate(ctx):
        k = gather_kv(c.k_cache, c.block_tables[i], n)
        v = gather_kv(c.v_cache, c.block_tables[i], n)
        lo, hi = cu[i], cu[i + 1]
        want = _naive(c.q[lo:hi], k, v, n - (hi - lo), c.scale)
        torch.testing.assert_close(out[lo:hi].double(), want, atol=1e-5, rtol=1e-5)


def test_decode_reference_is_prefill_with_one_query_each_and_zero_for_padding():
    c = make_paged_case([9, 16, 0, 3], [1, 1, 0, 1], 1, 4, 16, 4, torch.float32, seed=3)
    q = torch.randn(4, 4, 16)
    ctx = c.context_lens
    dec = paged_decode_attention(
        q, c.k_cache, c.v_cache, c.block_tables, ctx, c.scale, backend="torch"
    )
    cu = torch.arange(5, dtype=torch.int32)
    ctx1 = ctx.clone()
    pre = paged_prefill_attention(
        q, c.k_cache, c.v_cache, c.block_tables, cu, ctx1, c.scale, backend="torch"
    )
    assert torch.equal(dec[[0, 1, 3]], pre[[0, 1, 3]])
    assert torch.count_nonzero(dec[2]) == 0


def test_gather_reads_back_what_write_stored():
    bs, nb = 4, 6
    k = torch.zeros(nb, bs, 2, 8)
    v = torch.zeros(nb, bs, 2, 8)
    table = torch.tensor([5, 0, 3], dtype=torch.int32)
    n = 10
    pos = torch.arange(n)
    slots = table[pos // bs].long() * bs + pos % bs
    key, value = torch.randn(n, 2, 8), torch.randn(n, 2, 8)
    write_kv_torch(key, value, k, v, slots)
    assert torch.equal(gather_kv(k, table, n), key)
    assert torch.equal(gather_kv(v, table, n), value)
    assert math.isclose(k[1].abs().sum().item(), 0.0)  # block 1 is not in the table
