"""Paged decode attention: the Triton kernel (split-K or not) against the torch reference."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import
pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from executor.kernels import (  # noqa: E402
    allocate_kv_cache,
    layer_kv,
    paged_decode_attention,
    paged_prefill_attention,
)
from executor.kernels.testing import assert_close, kernel_device, make_paged_case  # noqa: E402
from executor.kernels.tiling import choose_num_splits  # noqa: E402

DEVICE = kernel_device()
DTYPES = [torch.float32, torch.float16]


def _run(c, backend, **kw):
    return paged_decode_attention(
        c.q, c.k_cache, c.v_cache, c.block_tables, c.context_lens, c.scale, backend=backend, **kw
    )


def _check(ctx, kv_heads, group, head_dim, block_size, dtype, seed=0, **kw):
    c = make_paged_case(
        ctx,
        [1 if n else 0 for n in ctx],
        kv_heads,
        group,
        head_dim,
        block_size,
        dtype,
        DEVICE,
        seed,
    )
    if 0 in ctx:  # padding rows still carry a (garbage) query
        c.q = torch.randn(len(ctx), kv_heads * group, head_dim).to(dtype=dtype, device=DEVICE)
    want = _run(c, "torch")
    got = _run(c, "triton", **kw)
    assert_close(got, want, dtype)
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size", [8, 16])
def test_block_boundaries(dtype, num_splits, block_size):
    b = block_size
    ctx = [1, b - 1, b, b + 1, 2 * b - 1, 2 * b, 2 * b + 1, 4 * b]
    _check(ctx, 2, 2, 32, block_size, dtype, num_splits=num_splits, block_n=16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
def test_gqa_ratios(dtype, group):
    _check([5, 33, 70], 2, group, 16, 16, dtype, seed=group, num_splits=2, block_n=32)


@pytest.mark.parametrize("head_dim", [16, 32, 64, 48])
def test_head_dims(head_dim):
    _check([19, 64], 1, 4, head_dim, 16, torch.float16, seed=head_dim)


@pytest.mark.parametrize(("block_size", "block_n"), [(8, 32), (32, 16), (16, 16), (4, 64)])
def test_key_tile_independent_of_cache_block(block_size, block_n):
    """A key tile may span several cache blocks or a fraction of one."""
    _check([3, 45, 96], 2, 2, 32, block_size, torch.float32, block_n=block_n, num_splits=2)


@pytest.mark.parametrize("num_splits", [1, 2, 8])
def test_many_splits_short_contexts_and_padding_rows(num_splits):
    """Splits that get no keys, and a zero-length padding row (output zeros, no NaN)."""
    got = _check([1, 0, 17, 3], 2, 4, 16, 8, torch.float32, num_splits=num_splits, block_n=16)
    assert torch.count_nonzero(got[1]) == 0


def test_out_buffer_and_strided_q_and_layer_views():
    kv = allocate_kv_cache(2, 12, 8, 2, 32, torch.float16, DEVICE)
    k, v = layer_kv(kv, 1)
    c = make_paged_case([30, 9], [1, 1], 2, 3, 32, 8, torch.float16, DEVICE, seed=5)
    k[: c.k_cache.shape[0]] = c.k_cache
    v[: c.v_cache.shape[0]] = c.v_cache
    qkv = torch.randn(2, 6 + 2 + 2, 32).to(dtype=torch.float16, device=DEVICE)
    q = qkv[:, :6]  # a strided slice of a fused projection
    args = (q, k, v, c.block_tables, c.context_lens, c.scale)
    want = paged_decode_attention(*args, backend="torch")
    out = torch.full_like(want, float("nan"))
    got = paged_decode_attention(*args, out=out, num_splits=2, block_n=16)
    assert got is out
    assert_close(got, want, torch.float16)


def test_prefill_kernel_with_single_queries_agrees():
    c = make_paged_case([1, 16, 17, 40], [1, 1, 1, 1], 2, 4, 32, 16, torch.float32, DEVICE, 7)
    dec = _run(c, "triton", num_splits=2, block_n=16)
    pre = paged_prefill_attention(
        c.q,
        c.k_cache,
        c.v_cache,
        c.block_tables,
        c.cu_q_lens,
        c.context_lens,
        c.scale,
        block_m=16,
        block_n=16,
    )
    assert_close(dec, pre, torch.float32)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    ctx=st.lists(st.integers(1, 80), min_size=1, max_size=4),
    kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 2, 4, 5, 8]),
    head_dim=st.sampled_from([16, 32]),
    block_size=st.sampled_from([4, 8, 16]),
    num_splits=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(ctx, kv_heads, group, head_dim, block_size, num_splits, dtype, seed):
    _check(
        ctx, kv_heads, group, head_dim, block_size, dtype, seed, num_splits=num_splits, block_n=16
    )


@pytest.mark.parametrize(
    ("num_seqs", "max_ctx", "want"),
    # 8 KV heads, 132 SMs (H200); the fastest measured split counts, see choose_num_splits.
    [(1, 512, 4), (1, 2048, 16), (1, 8192, 32), (4, 2048, 8), (16, 2048, 2), (32, 2048, 1)],
)
def test_split_heuristic(num_seqs, max_ctx, want):
    assert choose_num_splits(num_seqs, 8, 132, max_ctx) == want
    assert choose_num_splits(num_seqs, 8, 132, None) >= want
