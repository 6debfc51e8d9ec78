"""Ragged paged prefill attention: the Triton kernel against the torch reference."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import
pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from executor.kernels import paged_prefill_attention  # noqa: E402
from executor.kernels.testing import assert_close, kernel_device, make_paged_case  # noqa: E402

DEVICE = kernel_device()
DTYPES = [torch.float32, torch.float16]


def _run(c, backend, **kw):
    return paged_prefill_attention(
        c.q,
        c.k_cache,
        c.v_cache,
        c.block_tables,
        c.cu_q_lens,
        c.context_lens,
        c.scale,
        backend=backend,
        **kw,
    )


def _check(ctx, q_lens, kv_heads, group, head_dim, block_size, dtype, seed=0, **kw):
    c = make_paged_case(ctx, q_lens, kv_heads, group, head_dim, block_size, dtype, DEVICE, seed)
    want = _run(c, "torch")
    got = _run(c, "triton", **kw)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("ctx", "q_lens"),
    [
        ([50, 17, 33], [50, 1, 1]),  # a whole prompt, then two decodes
        ([70, 16, 1, 49], [37, 1, 1, 1]),  # a chunk after a 33-token prefix, mid-block both ends
        ([5, 64, 24], [1, 13, 24]),  # decode first; a chunk that ends on a block boundary
        ([32, 33, 31], [16, 17, 15]),  # chunks starting on, after and before a boundary
    ],
)
def test_mixed_batches(dtype, ctx, q_lens):
    _check(ctx, q_lens, 2, 2, 32, 16, dtype, block_m=16, block_n=16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8])
def test_gqa_ratios(dtype, group):
    _check([40, 9, 25], [23, 1, 25], 2, group, 16, 8, dtype, seed=group, block_m=32, block_n=16)


@pytest.mark.parametrize(
    ("block_m", "block_n", "block_size"),
    [(16, 16, 16), (16, 32, 8), (64, 16, 32), (32, 64, 4)],
)
def test_tiles_vs_cache_blocks(block_m, block_n, block_size):
    """Query tiles of several sizes; key tiles spanning several cache blocks or part of one."""
    _check(
        [90, 31, 1, 66],
        [45, 31, 1, 2],
        1,
        4,
        32,
        block_size,
        torch.float32,
        block_m=block_m,
        block_n=block_n,
    )


@pytest.mark.parametrize("head_dim", [16, 64, 48])
def test_head_dims(head_dim):
    _check([20, 8], [12, 1], 1, 2, head_dim, 16, torch.float16, seed=head_dim)


def test_query_tiles_of_exact_multiples_of_block_q():
    # block_m 16, group 2 -> 8 query tokens per tile: lengths 8k and 8k +- 1.
    _check(
        [16, 17, 15, 24, 8], [16, 17, 15, 8, 8], 1, 2, 16, 8, torch.float32, block_m=16, block_n=16
    )


def test_padding_sequences_without_queries():
    """Zero-query (and zero-length) sequences in the batch get no program and disturb nothing."""
    _check([12, 0, 7, 30, 5], [3, 0, 0, 30, 1], 2, 2, 16, 8, torch.float32, block_m=16, block_n=16)


def test_padding_sequence_with_queries_gives_zeros():
    """A captured mixed step pads its tokens with a context-0 sequence that owns the spare
    queries: both backends write zeros there and leave the real sequences' rows as without it."""
    c = make_paged_case([12, 7, 0], [3, 1, 0], 2, 2, 16, 8, torch.float32, DEVICE, seed=5)
    want_real = _run(c, "torch")
    spare = 6
    c.q = torch.cat([c.q, torch.randn(spare, *c.q.shape[1:]).to(c.q)])
    c.cu_q_lens = c.cu_q_lens.clone()
    c.cu_q_lens[-1] += spare
    for backend in ("torch", "triton"):
        out = torch.full_like(c.q, float("nan"))
        got = _run(
            c, backend, out=out, **({"block_m": 16, "block_n": 16} if backend == "triton" else {})
        )
        assert_close(got[:4], want_real, torch.float32)
        assert torch.equal(got[4:], torch.zeros_like(got[4:]))


def test_strided_q_and_out_buffer():
    c = make_paged_case([29, 6], [11, 2], 2, 2, 32, 8, torch.float16, DEVICE, seed=4)
    qkv = torch.randn(13, 4 + 2 + 2, 32).to(dtype=torch.float16, device=DEVICE)
    c.q = qkv[:, :4]
    want = _run(c, "torch")
    out = torch.full_like(want, float("nan"))
    got = _run(c, "triton", out=out, block_m=16, block_n=16)
    assert got is out
    assert_close(got, want, torch.float16)


@st.composite
def _batches(draw):
    n = draw(st.integers(1, 4))
    ctx, q_lens = [], []
    for _ in range(n):
        q_len = draw(st.sampled_from([1, 1, 2, 7, 16, 33]))
        ctx.append(q_len + draw(st.integers(0, 40)))
        q_lens.append(q_len)
    return ctx, q_lens


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    batch=_batches(),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3, 4, 8]),
    block_size=st.sampled_from([4, 8, 16]),
    block_m=st.sampled_from([16, 32]),
    block_n=st.sampled_from([16, 32]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_random_batches(batch, kv_heads, group, block_size, block_m, block_n, dtype, seed):
    ctx, q_lens = batch
    _check(
        ctx, q_lens, kv_heads, group, 16, block_size, dtype, seed, block_m=block_m, block_n=block_n
    )
