"""Random paged-attention problems for the kernel tests and ``gpu_check``.

A case scatters each sequence's tokens over randomly chosen (shuffled, non-contiguous) physical
blocks of a cache whose every slot, used or not, holds random data, so a kernel that reads the
wrong block or past a context's end gives a wrong answer rather than a lucky zero. Unused block-
table entries point at random blocks too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tiling import interpreting

# Allowed |kernel - fp32 reference| <= atol + rtol * |reference|, as (atol, rtol), for q, K, V
# ~ N(0, 1) and scale = head_dim ** -0.5 (outputs are averages of V rows, |o| mostly < 2).
# Interpreter (CPU): fp32 tl.dot is exact there. fp16: inputs and output are rounded to fp16 (half
# an ulp is 1e-3 at |o| = 2) and P is cast to fp16 before P @ V.
INTERPRETER_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3)}
# GPU: fp32 tl.dot runs as TF32 (10-bit mantissa, like fp16). bf16 has an 8-bit mantissa (half an
# ulp is 8e-3 at |o| = 2) and P is cast to bf16 before P @ V.
GPU_TOL = {torch.float32: (5e-3, 5e-3), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 2e-2)}


@dataclass
class PagedCase:
    q: torch.Tensor  # [total_q, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_q_lens: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    scale: float


def make_paged_case(
    context_lens: list[int],
    q_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
    spare_table_cols: int = 1,
) -> PagedCase:
    """A batch whose sequence ``i`` has ``context_lens[i]`` cached tokens, the last ``q_lens[i]``
    of them being this step's queries."""
    assert len(context_lens) == len(q_lens)
    assert all(0 <= ql <= cl for ql, cl in zip(q_lens, context_lens))
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(per_seq) + spare_blocks
    max_blocks = max(per_seq, default=0) + spare_table_cols
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(0, num_blocks, (len(context_lens), max(max_blocks, 1)), generator=gen)
    used = 0
    for i, n in enumerate(per_seq):
        table[i, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    q = torch.randn((sum(q_lens), num_kv_heads * group, head_dim), generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return PagedCase(
        q=q.to(dtype=dtype, device=device),
        k_cache=k_cache.to(dtype=dtype, device=device),
        v_cache=v_cache.to(dtype=dtype, device=device),
        block_tables=table.to(dtype=torch.int32, device=device),
        cu_q_lens=cu.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        scale=head_dim**-0.5,
    )


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def kernel_device() -> torch.device:
    """Where the Triton kernels run: the GPU if there is one and we are not interpreting."""
    if torch.cuda.is_available() and not interpreting():
        return torch.device("cuda")
    return torch.device("cpu")


def tolerance(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    """(atol, rtol) for comparing a kernel of ``dtype`` on ``device`` with the fp32 reference."""
    return (GPU_TOL if device.type == "cuda" else INTERPRETER_TOL)[dtype]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = tolerance(dtype, actual.device)
    err = (actual.float() - expected.float()).abs()
    bound = atol + rtol * expected.float().abs()
    worst = (err - bound).max().item() if err.numel() else 0.0
    assert worst <= 0.0, f"max error {err.max().item():.3g} over atol {atol} + rtol {rtol}"
