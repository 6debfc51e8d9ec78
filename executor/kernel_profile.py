"""Where a decode step's GPU time goes: kernels of the engine's decode steps, by name.

    python -m executor.kernel_profile [--model qwen2.5-0.5b] [--concurrency 1] [--out CSV]

Runs ``c`` requests (256 random prompt tokens, 128 new tokens forced, seeded random bf16
weights) offline under ``torch.profiler`` and sums the GPU kernels launched while the engine
decodes (CUDA-graph replays included). Prints, per kernel name, its launches and GPU
microseconds per decode step, largest first, and the total; the gap between that total and the
measured step time is launch latency and idle GPU. A diagnostic, not a benchmark: profiling
slows the host.
"""

from __future__ import annotations

import argparse
import sys

import torch

from executor.bench import _prompts, _requests, bench_engine, device_random_weights
from executor.model import CausalLM, ModelConfig


def profile(name: str, c: int, seed: int = 0) -> tuple[list[tuple[str, float, float]], int]:
    """(kernel name, launches per step, GPU us per step) rows, largest first; decode steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = CausalLM(ModelConfig.for_preset(name), device="cuda", dtype=torch.bfloat16)
    device_random_weights(model, seed)
    engine = bench_engine(model, c, mixed_graphs=False)  # the prefill step eagerly
    engine.warmup()
    prompts = _prompts(c, model.config.vocab_size, seed + c)
    engine.run_offline(_requests(prompts))  # warm
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        rec = engine.run_offline(_requests(prompts))
        torch.cuda.synchronize()
    steps = int((rec.prefill_tokens == 0).sum())
    prefill_steps = len(rec.prefill_tokens) - steps
    totals: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = totals.setdefault(ev.name, [0.0, 0.0])
        t[0] += 1
        t[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    # prefill steps launch the same kernels on more tokens; their share is left in (a few steps)
    rows = [(n, k / steps, us / steps) for n, (k, us) in totals.items()]
    rows.sort(key=lambda r: -r[2])
    return rows, prefill_steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m executor.kernel_profile")
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("executor.kernel_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    rows, prefill_steps = profile(a.model, a.concurrency)
    total = sum(r[2] for r in rows)
    launches = sum(r[1] for r in rows)
    print(f"{a.model} c={a.concurrency}: per decode step ({prefill_steps} prefill steps included)")
    print(f"{'us/step':>9} {'launches':>9}  kernel")
    for name, k, us in rows[: a.top]:
        print(f"{us:>9.1f} {k:>9.1f}  {name[:110]}")
    print(f"{total:>9.1f} {launches:>9.1f}  TOTAL ({len(rows)} kernel names)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
