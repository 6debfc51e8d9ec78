"""Launch choices for the Triton kernels: tile sizes, warps, pipelining depth, split-K.

Fixed heuristics rather than ``@triton.autotune``: autotuning benchmarks on a shape's first call,
which must not happen inside a CUDA-graph capture, and it does not run under the interpreter.
The numbers are leads for an H200 (sm_90), to be checked with ``executor.kernels.gpu_check``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

# A decode split should read at least this many tokens, or the reduce costs more than it saves.
MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 32


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Tiles:
    block_m: int  # query rows (query tokens x heads of one KV group) per program
    block_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int


def decode_tiles(head_dim: int, block_n: int | None = None) -> Tiles:
    """Decode: rows are the KV head's query group padded to 16 (tl.dot's minimum).

    Measured on an H200 (bf16, d=128, 8 KV heads, graph replay): 128 keys x 4 warps x 3 stages
    was best or within 1.5% of it for batch 1-256 at context 512/2048, 7-25% faster than 64 x 2.
    """
    bn = block_n or (128 if head_dim <= 128 else 64)
    return Tiles(block_m=16, block_n=bn, num_warps=4, num_stages=3)


def prefill_tiles(
    head_dim: int, group: int, block_m: int | None = None, block_n: int | None = None
) -> Tiles:
    """Prefill: BLOCK_M rows = (BLOCK_M // next_pow2(group)) query tokens x the padded group.

    On an H200 (bf16, d=128, group 4) 64 x 64 x 4 warps x 2 stages was the best of BLOCK_M 64/128,
    BLOCK_N 32/64/128, 4/8 warps, 2/3 stages for a 2048 prompt and for a mixed chunk+decodes step.
    """
    bm = block_m or (64 if head_dim <= 128 else 32)
    bm = max(bm, 16, next_pow2(group))
    bn = block_n or (64 if head_dim <= 128 else 32)
    return Tiles(block_m=bm, block_n=bn, num_warps=4, num_stages=2)


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, num_sms: int, max_context_len: int | None = None
) -> int:
    """How many pieces to split each sequence's context into (flash-decoding).

    One program per (sequence, KV head) already fills the GPU at batch x kv_heads >= #SMs; below
    that, aim at about two programs per SM, rounded down to a power of two, and (if the host knows
    ``max_context_len``) no piece shorter than MIN_TOKENS_PER_SPLIT. On an H200 (132 SMs, 8 KV
    heads, d=128, CUDA graphs) this picked the fastest split, or one within 10% of it, for batch
    1/4/16/32 at contexts 512/2048/8192 (e.g. batch 1 at 2048: 16 splits, 6.7 us against 34 us
    unsplit). Batch 64 at contexts >= 2048 was 10-15% faster with 2-4 splits; not taken yet.
    """
    programs = max(1, num_seqs * num_kv_heads)
    if programs >= num_sms:
        return 1
    splits = -(-2 * num_sms // programs)
    if max_context_len is not None:
        splits = min(splits, -(-max_context_len // MIN_TOKENS_PER_SPLIT))
    splits = max(1, min(splits, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


def decode_num_splits(
    num_seqs: int, num_kv_heads: int, max_context_len: int | None, device: torch.device
) -> int:
    """``choose_num_splits`` for ``device``'s SM count; 1 off the GPU (interpreter, CPU)."""
    if device.type != "cuda" or interpreting():
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return choose_num_splits(num_seqs, num_kv_heads, _num_sms(index), max_context_len)
