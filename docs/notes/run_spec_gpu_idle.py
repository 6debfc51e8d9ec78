"""Where a speculative step's time goes on the GPU (issue 21): the 7B shape at batch 1, plain
and with the EAGLE-3-layout draft head (k = 4, stated alpha 0.7), under torch.profiler: the
GPU's busy time (the union of its kernels' intervals) per engine step, against the wall time.
On the GPU machine: python3 docs/notes/run_spec_gpu_idle.py  (prints a table; JSON to $OUT)."""

import json
import os

import torch
from torch.profiler import ProfilerActivity, profile

from executor.draft_head import draft_head_of
from executor.paged_draft import PagedDraftModelDrafter
from executor.spec_bench import load_model
from executor.spec_held import HeldWorkload, held_engine, run_cell


def busy_ms(prof) -> float:  # noqa: ANN001
    """The union of the GPU kernels' intervals, in ms."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    total, end = 0, None
    for a, b in spans:
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e3  # us -> ms


work = HeldWorkload(512, 128, 256)
target, _ = load_model("qwen2.5-7b", "bfloat16", "cuda")
head = draft_head_of(target.config, "bfloat16", "cuda", seed=11, draft_vocab=32000)
engine = held_engine(target, 1, work, 4)
drafter = PagedDraftModelDrafter(head, max_seqs=1, max_len=work.max_len(4))
drafter.capture_graphs()
out = []
for k in (0, 4, 0, 4):
    run_cell(engine, work, 1, k, 0.7, drafter)  # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        row = run_cell(engine, work, 1, k, 0.7, drafter)
    busy = busy_ms(prof)
    wall = 1e3 * row["wall_s"]
    steps = row["steps"]
    out.append(
        {
            "k": k,
            "wall_ms": wall,
            "gpu_busy_ms": busy,
            "steps": steps,
            "draft_s": row.get("draft_s"),
            "tok_s": row["tok_s"],
        }
    )
    print(
        f"k={k}: {steps} steps, wall {wall / steps:.3f} ms/step, GPU busy {busy / steps:.3f} "
        f"ms/step, idle {(wall - busy) / steps:.3f} ms/step, tok/s {row['tok_s']:.0f}",
        flush=True,
    )
with open(os.path.join(os.environ.get("OUT", "."), "spec_gpu_idle.json"), "w") as f:
    json.dump(out, f, indent=1)
