"""Paged-attention kernels: KV write, decode attention, ragged prefill attention.

Layout (see ``layout.py``): per layer, ``k_cache`` and ``v_cache`` are
``[num_blocks, block_size, num_kv_heads, head_dim]`` with the last dim contiguous and equal
strides (the engine's ``[layers, 2, ...]`` tensor gives contiguous views). Block tables are
``[num_seqs, max_blocks]`` int32 of BlockPool ids; a token's slot is
``block * block_size + offset``.

Every function takes ``backend="triton"`` (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)
or ``backend="torch"`` (the fp32 reference in ``reference.py``; the engine's CPU path; reads
lengths back to the host). The Triton paths never synchronise with the host and size their grids
from tensor shapes only, so they can be captured in CUDA graphs with persistent metadata buffers.

GQA: ``num_heads = num_kv_heads * group``; query head ``h`` uses KV head ``h // group``.
Dtypes: ``q`` and the caches share one of fp16, bf16, fp32 (fp32 ``tl.dot`` is TF32 on the GPU).
"""

from __future__ import annotations

import torch

from . import reference
from .layout import allocate_kv_cache, kv_cache_shape, layer_kv
from .tiling import decode_num_splits, decode_tiles, prefill_tiles

__all__ = [
    "allocate_kv_cache",
    "kv_cache_shape",
    "layer_kv",
    "paged_decode_attention",
    "paged_prefill_attention",
    "write_kv",
]

_BACKENDS = ("triton", "torch")
_INDEX_DTYPES = (torch.int32, torch.int64)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_backend(backend: str) -> None:
    _check(backend in _BACKENDS, f"unknown backend {backend!r}; known: {', '.join(_BACKENDS)}")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    shape = tuple(k_cache.shape)
    _check(k_cache.dim() == 4, f"k_cache must be [blocks, block_size, kv_heads, dim], got {shape}")
    _check(k_cache.shape == v_cache.shape, "k_cache and v_cache shapes differ")
    _check(k_cache.stride() == v_cache.stride(), "k_cache and v_cache strides differ")
    _check(k_cache.dtype == v_cache.dtype, "k_cache and v_cache dtypes differ")
    _check(k_cache.stride(-1) == 1, "the caches' last dim must be contiguous")


def _check_attention(q, k_cache, v_cache, block_tables, context_lens, out) -> None:
    _check_cache(k_cache, v_cache)
    _check(q.dim() == 3 and q.stride(-1) == 1, "q must be [tokens, heads, dim], last dim dense")
    _check(q.shape[2] == k_cache.shape[3], "q and cache head_dim differ")
    _check(q.shape[1] % k_cache.shape[2] == 0, "num_heads must be a multiple of num_kv_heads")
    _check(q.dtype == k_cache.dtype, f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    _check(block_tables.dim() == 2 and block_tables.dtype in _INDEX_DTYPES, "bad block_tables")
    _check(block_tables.stride(-1) == 1, "block_tables rows must be contiguous")
    _check(context_lens.dim() == 1 and context_lens.dtype in _INDEX_DTYPES, "bad context_lens")
    _check(block_tables.shape[0] == context_lens.shape[0], "one block-table row per sequence")
    if out is not None:
        _check(out.shape == q.shape and out.dtype == q.dtype, "out must match q's shape and dtype")
        _check(out.stride(-1) == 1, "out's last dim must be contiguous")


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str = "triton",
) -> None:
    """Store new tokens' K and V into one layer's paged cache.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``; last dim contiguous (token and head
            strides are free, so slices of a fused QKV output work); cast to the cache dtype.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``. **Mutated**: the
            rows at the given slots, nothing else.
        slot_mapping: ``[num_tokens]`` int32/int64, ``block_id * block_size + offset``; ``-1``
            skips the token (padding). Valid slots must be distinct.
    """
    _check_backend(backend)
    _check_cache(k_cache, v_cache)
    _check(key.dim() == 3 and key.shape == value.shape, "key/value must be [tokens, kv_heads, dim]")
    _check(key.shape[1:] == k_cache.shape[2:], "key/value heads or dim differ from the cache's")
    _check(key.stride(-1) == 1 and value.stride(-1) == 1, "key/value last dim must be contiguous")
    _check(
        slot_mapping.shape == (key.shape[0],) and slot_mapping.dtype in _INDEX_DTYPES,
        "slot_mapping must be [num_tokens] int32/int64",
    )
    if backend == "torch":
        reference.write_kv_torch(key, value, k_cache, v_cache, slot_mapping)
        return
    from .kv_write import write_kv_triton

    write_kv_triton(key, value, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    backend: str = "triton",
    num_splits: int | None = None,
    max_context_len: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged context.

    Args:
        q: ``[num_seqs, num_heads, head_dim]``, last dim contiguous.
        k_cache, v_cache: one layer's ``[num_blocks, block_size, num_kv_heads, head_dim]``; the
            new token's K/V must already be written. Read only.
        block_tables: ``[num_seqs, max_blocks]`` int32, rows contiguous.
        context_lens: ``[num_seqs]`` int32, tokens in context *including* the new one. A length
            of 0 (a padding row of a captured batch) yields zeros.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        out: optional ``[num_seqs, num_heads, head_dim]`` buffer of q's dtype, **overwritten**.
        num_splits: split-K pieces per sequence (Triton only); ``None`` chooses from the batch
            size and the GPU's SM count (fix it when capturing a CUDA graph).
        max_context_len: optional host-side bound on ``context_lens``, refines that choice.
        block_n: keys per inner step (Triton only), default from ``tiling.decode_tiles``.

    Returns:
        ``out`` (allocated if not given), dtype of ``q``.
    """
    _check_backend(backend)
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, out)
    _check(block_tables.shape[0] == q.shape[0], "one block-table row per query token")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if backend == "torch":
        return reference.paged_decode_attention_torch(
            q, k_cache, v_cache, block_tables, context_lens, scale, out
        )
    from .paged_decode import paged_decode_triton

    if num_splits is None:
        num_splits = decode_num_splits(q.shape[0], k_cache.shape[2], max_context_len, q.device)
    _check(num_splits >= 1, "num_splits must be >= 1")
    tiles = decode_tiles(q.shape[2], block_n)
    return paged_decode_triton(
        q, k_cache, v_cache, block_tables, context_lens, scale, out, num_splits, tiles
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    backend: str = "triton",
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Ragged causal attention of a mixed step (prefill chunks and decodes) over paged context.

    Sequence ``i``'s queries are ``q[cu_q_lens[i]:cu_q_lens[i+1]]`` (``q_len_i`` tokens, 1 for a
    decode) at positions ``[context_lens[i] - q_len_i, context_lens[i])``. Each attends to all
    earlier tokens of its sequence (a cached prefix, read through the block table) and causally
    to the chunk itself; the chunk's K/V must already be written. Chunks may start and end
    mid-block.

    Args:
        q: ``[total_q, num_heads, head_dim]`` packed queries, last dim contiguous.
        k_cache, v_cache: one layer's ``[num_blocks, block_size, num_kv_heads, head_dim]``;
            read only.
        block_tables: ``[num_seqs, max_blocks]`` int32, rows contiguous.
        cu_q_lens: ``[num_seqs + 1]`` int32, non-decreasing, ``cu_q_lens[-1] == total_q``.
        context_lens: ``[num_seqs]`` int32, ``context_lens[i] >= q_len_i``, or 0 for a padding
            sequence (any ``q_len_i``): its outputs are zeros.
        scale: softmax scale.
        out: optional ``[total_q, num_heads, head_dim]`` buffer of q's dtype, **overwritten**.
        block_m, block_n: tile sizes (Triton only), defaults from ``tiling.prefill_tiles``.

    Returns:
        ``out`` (allocated if not given), dtype of ``q``.
    """
    _check_backend(backend)
    _check_attention(q, k_cache, v_cache, block_tables, context_lens, out)
    _check(
        cu_q_lens.shape == (context_lens.shape[0] + 1,) and cu_q_lens.dtype in _INDEX_DTYPES,
        "cu_q_lens must be [num_seqs + 1] int32/int64",
    )
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if backend == "torch":
        return reference.paged_prefill_attention_torch(
            q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale, out
        )
    from .paged_prefill import paged_prefill_triton

    group = q.shape[1] // k_cache.shape[2]
    tiles = prefill_tiles(q.shape[2], group, block_m, block_n)
    return paged_prefill_triton(
        q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale, out, tiles
    )
