"""A compute-bound step's time as a function of what ran before it: full prefill steps
separated by ``gap`` decode steps, with the GPU's SM clock and power read after every step.

    python -m executor.duty_cycle --model qwen2.5-7b --out results/duty_cycle/h200_7b.json

For each gap (0: full steps back to back) the runner executes ``rounds`` times one full step
(one chunk of ``--chunk`` tokens) and then ``gap`` decode steps (``--decodes`` requests at
``--context`` tokens), as ``executor.profiler`` does (synthetic requests, no token committed,
wall time of ``ModelRunner.execute``). It answers whether a step after compute-bound steps is
slower than the same step after memory-bound ones (the lease-independent part of the fidelity
report's step bias) and whether the SM clock moves with it. Clocks and power come from NVML
(``pynvml``) where it is importable; otherwise they are absent (null).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from executor.profiler import Shape, StepProfiler, _setup, stamp

GAPS = (0, 1, 2, 4, 8, 16, 32, 128)


def _nvml():  # noqa: ANN202 - a reader of (SM MHz, W), or None
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no NVML: no clocks
        return None

    def read() -> tuple[float, float]:
        sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        return float(sm), pynvml.nvmlDeviceGetPowerUsage(h) / 1e3

    return read


def _timed(prof: StepProfiler, plan, tables, read) -> tuple[float, float | None, float | None]:  # noqa: ANN001
    prof._sync()
    t0 = time.perf_counter()
    prof.runner.execute(plan, lambda r: tables[r.request_id], commit=False)
    prof._sync()
    t = time.perf_counter() - t0
    sm, watts = read() if read else (None, None)
    return t, sm, watts


def run(prof: StepProfiler, full: Shape, decode: Shape, gaps, rounds: int) -> list[dict]:  # noqa: ANN001
    """One row per gap: the full and decode steps' median times, clocks and power; every
    request started is released, also when a shape does not fit the cache (ValueError)."""
    fplan, ftab = prof.build(full)
    plans, rows = [fplan], []
    try:
        first_block = full.num_blocks(prof.runner.block_size)
        dplan, dtab = prof.build(decode, first_id=len(ftab), first_block=first_block)
        plans.append(dplan)
        _gaps(prof, (fplan, ftab), (dplan, dtab), gaps, rounds, _nvml(), rows)
    finally:
        for plan in plans:
            for r in (*plan.decodes, *(r for r, _ in plan.prefills)):
                prof.runner.release(r)
    return rows


def _gaps(prof, full, decode, gaps, rounds, read, rows) -> None:  # noqa: ANN001
    (fplan, ftab), (dplan, dtab) = full, decode
    for gap in gaps:
        f, d, t0 = [], [], time.time()
        for _ in range(rounds):
            f.append(_timed(prof, fplan, ftab, read))
            d += [_timed(prof, dplan, dtab, read) for _ in range(gap)]
        span = {"wall_start": t0, "wall_end": time.time()}  # to join an nvidia-smi log
        rows.append({"gap": gap, **_stats("full", f[2:]), **_stats("decode", d), **span})


def _stats(kind: str, xs: list) -> dict:
    """Medians of (seconds, SM MHz, W) triples as ``<kind>_ms``, ``_sm_mhz``, ``_w``."""
    out: dict = {f"{kind}_steps": len(xs)}
    for j, name in enumerate(("ms", "sm_mhz", "w")):
        v = [x[j] for x in xs if x[j] is not None]
        m = float(np.median(v)) if v else None
        out[f"{kind}_{name}"] = m * 1e3 if (m is not None and name == "ms") else m
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--decodes", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("executor.duty_cycle needs a CUDA GPU", file=sys.stderr)
        return 2
    a.block_size, a.max_kv_gib, a.max_num_seqs = 16, 40.0, 256
    a.max_num_batched_tokens = a.chunk
    full = Shape("prefill", chunks=((0, a.chunk),))
    decode = Shape("decode", decode_contexts=(a.context,) * a.decodes)
    both = Shape("both", decode_contexts=decode.decode_contexts + (a.chunk,))
    model, runner, _ = _setup(a, [both])
    prof = StepProfiler(runner, a.seed)
    run(prof, full, decode, (4,), 6)  # warm-up
    rows = run(prof, full, decode, GAPS, a.rounds)
    meta = stamp(
        model,
        runner,
        {"command": "python -m executor.duty_cycle " + " ".join(argv or sys.argv[1:])},
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("| gap (decode steps) | full ms | full SM MHz | full W | decode ms | decode SM MHz |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gap']} | {r['full_ms']:.2f} | {r['full_sm_mhz']} | {r['full_w']} | "
              f"{r['decode_ms'] or float('nan'):.3f} | {r['decode_sm_mhz']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
