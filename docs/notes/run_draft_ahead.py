"""Drafts on the device and drafting ahead on the GPU (issue 21). Three ways to run the draft
head's proposals: ``host`` (read back before the verification is staged, as before),
``device`` (left on the device while the runner stages the verification, read back with it)
and ``ahead`` (also launched right after each verification, so the host's update and plan
overlap the drafting).

0) check, fp32, the 0.5B shape as target with its draft head, k 4, batch 4: greedy outputs of
   each way against the host way's and plain decoding's (the target's judgement); under stated
   alpha 0.7, how many verifications' drafts equal the host way's.
a) the 7B shape (bf16, random weights) with its draft head, stated alpha 0.7: plain and each
   way in turn (batch 1: k 4 twice and k 8; batch 16 and 64: k 4), tokens/s against plain
   beside it in the same lease; the GPU's busy time per step at batch 1, k 4, host and ahead.
On the GPU machine: PYTHONPATH=. python3 docs/notes/run_draft_ahead.py  (JSON to $OUT)."""

import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from executor.draft_head import draft_head_of
from executor.paged_draft import PagedDraftModelDrafter
from executor.spec_bench import environment, load_model
from executor.spec_held import HeldWorkload, held_engine, run_cell, warm_drafter

OUT = os.environ.get("OUT", ".")
work = HeldWorkload(512, 128, 256)
result = {**environment("cuda"), "date": time.strftime("%Y-%m-%d"), "work": vars(work)}


WAYS = {"host": (False, False), "device": (False, True), "ahead": (True, True)}


def _drafter(head, batch: int, way: str, k_max: int = 8) -> PagedDraftModelDrafter:
    ahead, on_device = WAYS[way]
    return PagedDraftModelDrafter(
        head, max_seqs=batch, max_len=work.max_len(k_max), draft_ahead=ahead, on_device=on_device
    )


def _spy(engine):  # noqa: ANN001, ANN202
    log, real = [], engine.runner._verified

    def spy(ver, commit):  # noqa: ANN001, ANN202
        log.append(([r.request_id for r in ver.requests], [x.tolist() for x in ver.drafts]))
        return real(ver, commit)

    engine.runner._verified = spy
    return log, real


def check() -> dict:
    """fp32, the 0.5B shape and its head, batch 4, k 4 (see the module docstring)."""
    import dataclasses

    from horizon.speculation import SpeculationConfig

    target, _ = load_model("qwen2.5-0.5b", "float32", "cuda")
    head = draft_head_of(target.config, "float32", "cuda", seed=11)
    engine = held_engine(target, 4, work, 4)
    base = engine.config
    engine.run_offline(work.requests(4))
    plain = dict(engine.outputs)
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=4)
    greedy, stated = {}, {}
    for way in WAYS:
        engine.runner.drafter = d = _drafter(head, 4, way, 4)
        engine.config = dataclasses.replace(base, speculation=spec)
        engine.run_offline(work.requests(4))
        greedy[way] = dict(engine.outputs)
        engine.config = base
        log, real = _spy(engine)
        run_cell(engine, work, 4, 4, 0.7, d)
        engine.runner._verified = real
        stated[way] = (log, d.num_ahead)
    row = {"greedy_host_equals_plain": greedy["host"] == plain}
    for way in ("device", "ahead"):
        row[f"greedy_{way}_equals_host"] = greedy[way] == greedy["host"]
        same = sum(x == y for x, y in zip(stated[way][0], stated["host"][0]))
        row[f"stated_{way}_verifications_equal"] = f"{same}/{len(stated['host'][0])}"
    row["stated_ahead_drafts_ahead"] = stated["ahead"][1]
    print(f"check (0.5B fp32, head, k 4, batch 4): {row}", flush=True)
    del engine, target, head
    torch.cuda.empty_cache()
    return row


def busy_ms(prof) -> float:  # noqa: ANN001
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    total, end = 0, None
    for a, b in spans:
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total / 1e3


def ab(target, head, batch: int, cells, rows: list) -> None:  # noqa: ANN001
    engine = held_engine(target, batch, work, 8)
    drafters = {way: _drafter(head, batch, way) for way in {w for _, w in cells}}
    for d in drafters.values():
        warm_drafter(d, batch, target.config.vocab_size)
    plain = run_cell(engine, work, batch, 0, None, None)
    for k, way in cells:
        r = run_cell(engine, work, batch, k, 0.7, drafters[way])
        r["way"], r["speedup"], r["plain_tok_s"] = way, r["tok_s"] / plain["tok_s"], plain["tok_s"]
        rows.append(r)
        print(
            f"batch {batch} k {k} {way:6s}: {r['tok_s']:8.1f} tok/s (plain {plain['tok_s']:.1f}) "
            f"= {r['speedup']:.3f}x, drafts ahead {r['drafts_ahead']} in {r['steps']} steps",
            flush=True,
        )
        plain = run_cell(engine, work, batch, 0, None, None)  # plain again beside each cell
    if batch == 1:
        for way in ("host", "ahead"):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                r = run_cell(engine, work, 1, 4, 0.7, drafters[way])
            b, w, n = busy_ms(prof), 1e3 * r["wall_s"], r["steps"]
            row = {"way": way, "steps": n, "wall_ms": w, "gpu_busy_ms": b}
            result.setdefault("gpu_idle", []).append(row)
            print(f"profiled k 4 {way}: busy {b / n:.3f} idle {(w - b) / n:.3f} ms/step")
    del engine, drafters
    torch.cuda.empty_cache()


result["check"] = check()
target, _ = load_model("qwen2.5-7b", "bfloat16", "cuda")
head = draft_head_of(target.config, "bfloat16", "cuda", seed=11, draft_vocab=32000)
rows = result["rows"] = []
b1 = [(4, "host"), (4, "device"), (4, "ahead")] * 2 + [(8, "host"), (8, "ahead")]
wide = [(4, "host"), (4, "ahead")]
for batch, cells in ((1, b1), (16, wide), (64, wide)):
    ab(target, head, batch, cells, rows)
    with open(os.path.join(OUT, "draft_ahead.json"), "w") as f:
        json.dump(result, f)
print("\nbatch  k  way     tok/s    plain    speedup")
for r in rows:
    print(
        f"{r['batch']:5d} {r['k']:2d}  {r['way']:6s} {r['tok_s']:7.1f} "
        f"{r['plain_tok_s']:7.1f}  {r['speedup']:.3f}"
    )
