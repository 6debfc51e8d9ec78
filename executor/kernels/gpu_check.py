"""GPU check of the kernels: correctness in bf16/fp16 against the fp32 reference, then timings.

Run on a CUDA machine (meant for the H200, sm_90)::

    python -m executor.kernels.gpu_check [--quick] [--heads 32 --kv-heads 8 --head-dim 128]

Prints one PASS/FAIL line per case with the max error and the tolerance, then decode timings for
batch 1/32/128/256 at context 512 and 2048 (ms per call; effective bandwidth of the K/V bytes read
against the ~4.2 TB/s measured on an H200), prefill and KV-write timings. Exits 1 if a case fails.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys

import torch

from . import paged_decode_attention, paged_prefill_attention, write_kv
from .testing import PagedCase, make_paged_case, tolerance
from .tiling import decode_num_splits

H200_BANDWIDTH_GBS = 4200.0  # measured copy bandwidth, docs/design.md "Engine notes"
DEVICE = torch.device("cuda")


class Checker:
    def __init__(self) -> None:
        self.failures = 0
        self.cases = 0

    def compare(self, name: str, got: torch.Tensor, want: torch.Tensor, dtype) -> None:
        atol, rtol = tolerance(dtype, got.device)
        err = (got.float() - want.float()).abs()
        ok = bool(torch.all(err <= atol + rtol * want.float().abs()).item())
        self.cases += 1
        self.failures += not ok
        worst = err.max().item() if err.numel() else 0.0
        print(f"{'PASS' if ok else 'FAIL'}  {name}  max_err={worst:.2e} (atol {atol}, rtol {rtol})")


def _decode_case(chk: Checker, ctx, kv_heads, group, head_dim, bs, dtype, seed, **kw) -> None:
    q_lens = [1 if n else 0 for n in ctx]
    c = make_paged_case(ctx, q_lens, kv_heads, group, head_dim, bs, dtype, DEVICE, seed)
    c.q = torch.randn(len(ctx), kv_heads * group, head_dim, device=DEVICE).to(dtype)
    args = (c.q, c.k_cache, c.v_cache, c.block_tables, c.context_lens, c.scale)
    want = paged_decode_attention(*args, backend="torch")
    got = paged_decode_attention(*args, **kw)
    name = f"decode  {_dt(dtype)} g={group} kvh={kv_heads} d={head_dim} bs={bs} {kw} ctx={ctx}"
    chk.compare(name, got, want, dtype)


def _prefill_case(chk: Checker, ctx, q_lens, kv_heads, group, head_dim, bs, dtype, seed, **kw):
    c = make_paged_case(ctx, q_lens, kv_heads, group, head_dim, bs, dtype, DEVICE, seed)
    args = (c.q, c.k_cache, c.v_cache, c.block_tables, c.cu_q_lens, c.context_lens, c.scale)
    want = paged_prefill_attention(*args, backend="torch")
    got = paged_prefill_attention(*args, **kw)
    name = (
        f"prefill {_dt(dtype)} g={group} kvh={kv_heads} d={head_dim} bs={bs} {kw} "
        f"q_lens={q_lens} ctx={ctx}"
    )
    chk.compare(name, got, want, dtype)


def _kv_write_case(chk: Checker, num_tokens, kv_heads, head_dim, bs, dtype, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    num_blocks = num_tokens // bs + 4
    slots = torch.randperm(num_blocks * bs, generator=g)[:num_tokens]
    slots[torch.rand(num_tokens, generator=g) < 0.1] = -1
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    caches = []
    for backend in ("torch", "triton"):
        k = torch.zeros(num_blocks, bs, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        v = torch.zeros_like(k)
        write_kv(key, value, k, v, slots.to(DEVICE), backend=backend)
        caches.append(torch.cat([k, v]))
    name = f"kv_write {_dt(dtype)} T={num_tokens} kvh={kv_heads} d={head_dim} bs={bs}"
    chk.compare(name, caches[1], caches[0], dtype)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run_correctness(chk: Checker, quick: bool) -> None:
    rng = random.Random(0)
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16]
    for dtype in dtypes:
        for t, kvh, d, bs in [(1, 1, 64, 16), (300, 8, 128, 16), (77, 4, 64, 32)]:
            _kv_write_case(chk, t, kvh, d, bs, dtype, seed=t)
        boundaries = [1, 15, 16, 17, 255, 256, 257, 1000]
        for group in (1, 2, 4, 7, 8):
            for splits in (None, 1, 4, 16):
                _decode_case(chk, boundaries, 4, group, 128, 16, dtype, group, num_splits=splits)
        _decode_case(chk, [0, 33, 64], 2, 4, 64, 32, dtype, 1, num_splits=3)  # padding row
        mixed = [
            ([512, 17, 33], [512, 1, 1]),  # prompt + decodes
            ([612, 300, 1, 49], [37, 1, 1, 1]),  # chunk after a 575-token prefix, mid-block
            ([1024, 256, 257], [256, 16, 17]),  # chunks ending on/after a boundary
            ([2000, 40], [1000, 39]),
        ]
        for group in (1, 2, 4, 7, 8):
            for ctx, q_lens in mixed:
                _prefill_case(chk, ctx, q_lens, 4, group, 128, 16, dtype, group)
        _prefill_case(chk, [300, 5], [100, 5], 2, 4, 64, 16, dtype, 0, block_m=16, block_n=16)
        for seed in range(6 if quick else 20):  # random shapes
            group = rng.choice([1, 2, 3, 4, 5, 6, 7, 8])
            kvh = rng.choice([1, 2, 4, 8])
            d = rng.choice([64, 128])
            bs = rng.choice([8, 16, 32])
            n = rng.randint(1, 12)
            ctx = [rng.randint(1, 1500) for _ in range(n)]
            _decode_case(chk, ctx, kvh, group, d, bs, dtype, seed)
            q_lens = [rng.choice([1, 1, rng.randint(1, c)]) for c in ctx]
            _prefill_case(chk, ctx, q_lens, kvh, group, d, bs, dtype, seed)


def _device_case(ctx, q_lens, heads, kv_heads, head_dim, bs, dtype) -> PagedCase:
    """A timing problem made on the GPU (large caches are slow to fill on the host)."""
    per_seq = [-(-c // bs) for c in ctx]
    num_blocks = sum(per_seq)
    k = torch.randn(num_blocks, bs, kv_heads, head_dim, device=DEVICE, dtype=dtype)
    perm = torch.randperm(num_blocks, device=DEVICE).to(torch.int32)
    table = torch.zeros(len(ctx), max(per_seq), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(per_seq):
        table[i, :n] = perm[start : start + n]
        start += n
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE)
    return PagedCase(
        q=torch.randn(sum(q_lens), heads, head_dim, device=DEVICE, dtype=dtype),
        k_cache=k,
        v_cache=torch.randn_like(k),
        block_tables=table,
        cu_q_lens=cu,
        context_lens=torch.tensor(ctx, dtype=torch.int32, device=DEVICE),
        scale=head_dim**-0.5,
    )


def _bench(fn) -> tuple[float, float]:
    """(ms with L2 flushed between calls, ms replayed from a CUDA graph, L2 not flushed)."""
    import triton.testing as tt

    ms = tt.do_bench(fn, warmup=10, rep=50, return_mode="median")
    ms_graph = tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return ms, ms_graph


def _time_decode(batch, ctx, heads, kv_heads, head_dim, bs, dtype) -> str:
    c = _device_case([ctx] * batch, [1] * batch, heads, kv_heads, head_dim, bs, dtype)
    args = (c.q, c.k_cache, c.v_cache, c.block_tables, c.context_lens, c.scale)
    out = torch.empty_like(c.q)
    splits = decode_num_splits(batch, kv_heads, ctx, DEVICE)

    def call(s: int = splits) -> None:
        paged_decode_attention(*args, out=out, num_splits=s)

    ms, ms_graph = _bench(call)
    ms_1, ms_graph_1 = _bench(lambda: call(1)) if splits > 1 else (ms, ms_graph)
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * c.q.element_size()
    gbs, gbs_graph = kv_bytes / ms / 1e6, kv_bytes / ms_graph / 1e6
    pct = 100 * gbs / H200_BANDWIDTH_GBS
    return (
        f"{batch:>6} {ctx:>5} {splits:>6} {ms:>8.4f} {gbs:>7.0f} {pct:>5.1f} "
        f"{ms_graph:>9.4f} {gbs_graph:>8.0f} {ms_1:>9.4f} {ms_graph_1:>9.4f}"
    )


def run_decode_timing(heads, kv_heads, head_dim, bs, dtype) -> None:
    print(
        f"\ndecode timing: heads={heads} kv_heads={kv_heads} d={head_dim} block_size={bs} "
        f"{_dt(dtype)}; GB/s = K+V bytes read / time, ceiling ~{H200_BANDWIDTH_GBS:.0f}; "
        "\n  ms: stream launches, L2 flushed between calls (small batches show launch overhead); "
        "ms_graph: CUDA-graph replay, L2 warm; *_1: the same without split-K"
    )
    header = ["batch", "ctx", "splits", "ms", "GB/s", "%bw", "ms_graph", "GB/s_g", "ms_1"]
    header.append("ms_graph_1")
    widths = [6, 5, 6, 8, 7, 5, 9, 8, 9, 10]
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths)))
    for ctx in (512, 2048):
        for batch in (1, 32, 128, 256):
            print(_time_decode(batch, ctx, heads, kv_heads, head_dim, bs, dtype))
            torch.cuda.empty_cache()


def run_prefill_timing(heads, kv_heads, head_dim, bs, dtype) -> None:
    print(
        "\nprefill timing (attention FLOPs counted causally; GB/s of the distinct K/V bytes "
        "in context, each read at least once)"
    )
    cases = {
        "prompt 2048": ([2048], [2048]),
        "4 x prompt 1024": ([1024] * 4, [1024] * 4),
        "chunk 512 @1536 + 127 decodes @2048": ([2048] * 128, [512] + [1] * 127),
        "256 decodes @2048 (prefill kernel)": ([2048] * 256, [1] * 256),
    }
    for name, (ctx, q_lens) in cases.items():
        c = _device_case(ctx, q_lens, heads, kv_heads, head_dim, bs, dtype)
        args = (c.q, c.k_cache, c.v_cache, c.block_tables, c.cu_q_lens, c.context_lens, c.scale)
        out = torch.empty_like(c.q)
        ms = _bench(lambda a=args, o=out: paged_prefill_attention(*a, out=o))[0]
        # sum over queries of visible keys, x 4 * heads * head_dim (QK^T and PV).
        pairs = sum(ql * (cl - ql) + ql * (ql + 1) // 2 for cl, ql in zip(ctx, q_lens))
        tflops = 4 * pairs * heads * head_dim / ms / 1e9
        gbs = 2 * sum(ctx) * kv_heads * head_dim * c.q.element_size() / ms / 1e6
        print(f"  {name:<40} {ms:8.4f} ms  {tflops:6.1f} TFLOP/s  {gbs:6.0f} GB/s")


def run_kv_write_timing(kv_heads, head_dim, bs, dtype) -> None:
    print("\nkv_write timing")
    for n in (256, 8192):
        num_blocks = n // bs + 1
        k = torch.zeros(num_blocks, bs, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        v = torch.zeros_like(k)
        key = torch.randn(n, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        slots = torch.randperm(num_blocks * bs, device=DEVICE)[:n]
        ms = _bench(lambda k=k, v=v, key=key, s=slots: write_kv(key, key, k, v, s))[0]
        gbs = 4 * n * kv_heads * head_dim * key.element_size() / ms / 1e6
        print(f"  {n:>5} tokens  {ms:8.4f} ms  {gbs:7.0f} GB/s (read + write)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer correctness cases (bf16 only)")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    props = torch.cuda.get_device_properties(0)
    print(
        f"{props.name} sm_{props.major}{props.minor} {props.multi_processor_count} SMs; "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    chk = Checker()
    run_correctness(chk, a.quick)
    print(f"\ncorrectness: {chk.cases - chk.failures}/{chk.cases} PASS")
    if not a.no_timing:
        dims = (a.heads, a.kv_heads, a.head_dim, a.block_size, torch.bfloat16)
        run_decode_timing(*dims)
        run_prefill_timing(*dims)
        run_kv_write_timing(a.kv_heads, a.head_dim, a.block_size, torch.bfloat16)
    print("\nRESULT:", "FAIL" if chk.failures else "PASS")
    return 1 if chk.failures else 0


if __name__ == "__main__":
    sys.exit(main())
