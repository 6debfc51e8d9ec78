"""Single-token GEMVs: ``x @ W.T (+ b)`` and ``down(silu(gate) * up)`` for a one-row input.

At one token per step (single-stream decode) a small model's step is a few hundred launches of a
few microseconds each, and cuBLAS's GEMV kernels for its small matrices are latency-bound: on an
H200 under CUDA graphs, Qwen2.5-0.5B's ``[1152, 896]`` QKV projection with bias took 4.4 us, its
down projection a split-K kernel plus a reduce (~7 us, with SiLU*up another launch). Here one
program owns ``BLOCK_N`` output features and walks the reduction dimension in ``BLOCK_K`` chunks;
with one or two features per program there are hundreds to thousands of small independent
programs, which keeps the memory system busy. With ``swiglu`` the program forms its chunk of
``silu(g) * u`` from the ``[gate | up]`` row itself (a few KB from L2) with the reference's
roundings (SiLU rounded to the model dtype, the product rounded again). Products accumulate in
fp32; the sum (plus bias) is rounded once.

``FusedForward`` uses these where ``fits`` says so: one token and a weight of at most
``MAX_WEIGHT_BYTES`` (measured faster than cuBLAS there: ``python -m executor.gemv``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_WEIGHT_BYTES = 20 << 20  # 0.5B: all four (gate_up 16.6 MiB); 7B: none (>= 24.5 MiB)
# (BLOCK_N, BLOCK_K, num_warps), the best or within 5% of it on an H200 for each of the 0.5B's
# projections (executor.gemv's grid): 2.7 / 2.1 / 6.4 us for QKV / O / gate-up against cuBLAS's
# 4.2 / 4.4 / 7.4, and 6.9 us for SiLU*up + down against 8.3
TILES = (2, 1024, 4)
SWIGLU_TILES = (1, 1024, 4)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_out,
    k,
    stride_w,
    SWIGLU: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n_out
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    dt = out_ptr.dtype.element_ty
    for k0 in range(0, k, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < k
        if SWIGLU:
            g = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + k + cols, mask=col_mask, other=0.0).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # F.silu rounds
            x = (s * u).to(dt).to(tl.float32)  # and so does the product
        else:
            x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :],
            mask=row_mask[:, None] & col_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    if HAS_BIAS:  # F.linear adds the bias to the fp32 sum before rounding
        acc += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, acc.to(dt), mask=row_mask)


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``gemv``/``swiglu_down`` serve this call: one token, a small weight."""
    return x.shape[0] == 1 and weight.numel() * weight.element_size() <= MAX_WEIGHT_BYTES


def _launch(x, weight, bias, swiglu: bool, tiles=None) -> torch.Tensor:  # noqa: ANN001
    n, k = weight.shape
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError("gemv needs rows with unit stride")
    bn, bk, warps = tiles or (SWIGLU_TILES if swiglu else TILES)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else weight, out, n, k, weight.stride(0),
        SWIGLU=swiglu, HAS_BIAS=bias is not None, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
    )  # fmt: skip
    return out


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, tiles=None
) -> torch.Tensor:  # noqa: ANN001
    """``F.linear(x, weight, bias)`` of ``x`` ``[1, k]`` and ``weight`` ``[n, k]`` -> ``[1, n]``.
    ``tiles``: ``(BLOCK_N, BLOCK_K, num_warps)`` (default ``TILES``)."""
    if x.shape[0] != 1 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv takes x [1, {weight.shape[1]}], got {tuple(x.shape)}")
    return _launch(x, weight, bias, False, tiles)


def swiglu_down(gate_up: torch.Tensor, weight: torch.Tensor, tiles=None) -> torch.Tensor:  # noqa: ANN001
    """``F.linear(silu(gate) * up, weight)`` of ``gate_up = [gate | up]`` ``[1, 2k]`` and
    ``weight`` ``[n, k]`` -> ``[1, n]``, in ``gate_up``'s dtype."""
    k = weight.shape[1]
    if gate_up.shape[0] != 1 or gate_up.shape[1] != 2 * k:
        raise ValueError(f"swiglu_down takes gate_up [1, {2 * k}], got {tuple(gate_up.shape)}")
    return _launch(gate_up, weight, None, True, tiles)


def _timed(fn, layers: int) -> float:  # noqa: ANN001
    """Median GPU microseconds per layer of ``fn()`` replayed from one CUDA graph."""
    import statistics

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / layers)
    return statistics.median(times)


def _bench_shape(n: int, k: int, has_bias: bool, swiglu: bool, layers: int, grid) -> str:  # noqa: ANN001
    import torch.nn.functional as F

    from executor.fused import silu_mul

    g = torch.Generator(device="cuda").manual_seed(n * k)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=g).mul_(0.02).bfloat16()

    ws = [rand(n, k) for _ in range(layers)]
    bias = rand(n) if has_bias else None
    x = rand(1, 2 * k if swiglu else k)

    def ours(w: torch.Tensor, t=None) -> torch.Tensor:  # noqa: ANN001
        return swiglu_down(x, w, t) if swiglu else gemv(x, w, bias, t)

    def cublas(w: torch.Tensor) -> torch.Tensor:
        return F.linear(silu_mul(x), w) if swiglu else F.linear(x, w, bias)

    base = _timed(lambda: [cublas(w) for w in ws], layers)
    default = _timed(lambda: [ours(w) for w in ws], layers)
    ref = cublas(ws[0]).float()
    best = None
    for t in grid:
        err = (ours(ws[0], t).float() - ref).abs().max().item()
        us = _timed(lambda t=t: [ours(w, t) for w in ws], layers)
        if best is None or us < best[0]:
            best = (us, t, err)
    us, t, err = best
    return (
        f"[{n}, {k}] {n * k * 2 / 2**20:7.1f} MiB: cuBLAS {base:6.2f} us | default tiles "
        f"{default:6.2f} us ({base / default:.2f}x) | best {us:6.2f} us ({base / us:.2f}x) at "
        f"BLOCK_N={t[0]} BLOCK_K={t[1]} warps={t[2]}, max |diff| {err:.1e}"
    )


def _bench(argv: list[str] | None = None) -> int:
    """``python -m executor.gemv``: GPU time per layer of each of a model's four projections,
    one call per layer replayed from one CUDA graph, cuBLAS (``F.linear``; SiLU*up then
    ``F.linear`` for the down projection) against these kernels at the default tiles and the
    best of a grid, bf16."""
    import argparse
    import itertools

    from executor.model import ModelConfig

    p = argparse.ArgumentParser(prog="python -m executor.gemv")
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--block-n", default="1,2")
    p.add_argument("--block-k", default="512,1024,2048")
    p.add_argument("--warps", default="2,4,8")
    a = p.parse_args(argv)
    ints = [[int(x) for x in v.split(",")] for v in (a.block_n, a.block_k, a.warps)]
    grid = list(itertools.product(*ints))
    c = ModelConfig.for_preset(a.model)
    layers = min(c.num_layers, 24)
    shapes = {  # name: (out, in, bias, swiglu)
        "qkv": (c.q_size + 2 * c.kv_size, c.hidden_size, c.qkv_bias, False),
        "o": (c.hidden_size, c.q_size, False, False),
        "gate_up": (2 * c.intermediate_size, c.hidden_size, False, False),
        "down": (c.hidden_size, c.intermediate_size, False, True),
    }
    print(f"{a.model}: us per layer ({layers} layers in one graph), bf16")
    for name, shape in shapes.items():
        print(f"{name:<8}", _bench_shape(*shape, layers, grid), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_bench())
