"""What a draft position costs each drafter, against the draft model's own engine decode step.

For a batch size ``B``: the plain engine on the draft model (its decode step, replayed from a
CUDA graph on the GPU: median wall time of its decode-only steps, ``B`` requests of the grid's
prompt decoding 48 tokens), and each drafter proposing ``k`` drafts for ``B`` histories of that
prompt length, repeatedly, each history growing by the accepted drafts of a stated draw (so the
paged drafter's catch-up runs as in a verification loop): wall time per draft position (a
proposal of ``k`` is ``k`` positions). The ratio to the engine's step says how faithful a
drafter's cost is to a real paged draft model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from executor.drafter import Drafter
from horizon.request import Request


def engine_decode_ms(model, batch: int, prompt: int, new: int = 48) -> float:  # noqa: ANN001
    """Median ms of the plain engine's decode-only steps at ``batch`` on ``model``."""
    from executor.engine import Engine, EngineConfig

    max_len = prompt + new + 16
    cfg = EngineConfig(
        num_blocks=batch * -(-max_len // 16) + 16,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch),
        max_model_len=max_len,
    )
    engine = Engine(model, cfg)
    engine.warmup()
    reqs = [Request(i, 0.0, prompt, new, new) for i in range(batch)]
    engine.run_offline(reqs)  # warm
    rec = engine.run_offline([Request(i, 0.0, prompt, new, new) for i in range(batch)])
    dur = rec.step_durations()[rec.prefill_tokens == 0]
    return 1e3 * float(np.median(dur))


def drafter_ms_per_position(
    drafter: Drafter, batch: int, prompt: int, vocab: int, k: int, calls: int = 12
) -> float:
    """Wall ms per draft position of ``drafter`` over ``calls`` proposals (after 2 untimed)."""
    rng = np.random.default_rng(batch)
    hist = [rng.integers(0, vocab, prompt) for _ in range(batch)]
    ids = list(range(batch))
    total = 0.0
    for c in range(calls + 2):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        drafts = drafter.propose_batch(hist, [k] * batch, ids)
        total += (time.perf_counter() - t0) if c >= 2 else 0.0
        accepted = rng.integers(0, k + 1, batch)
        hist = [np.concatenate([h, d[:a], [int(rng.integers(0, vocab))]]) for h, d, a in
                zip(hist, drafts, accepted)]  # fmt: skip
    for i in ids:
        drafter.forget(i)
    return 1e3 * total / (calls * k)


def draft_costs(model, drafters: dict, batches: Sequence[int], prompt: int, k: int) -> list[dict]:  # noqa: ANN001
    """Per batch: the engine's decode step on ``model`` (a ``CausalLM``: a draft head, which
    the engine cannot serve, has none) and each drafter's ms per position (``drafters``: name
    -> function of the batch size giving a drafter, or None to skip it)."""
    from executor.model import CausalLM

    rows = []
    for b in batches:
        step = engine_decode_ms(model, b, prompt) if isinstance(model, CausalLM) else None
        row = {"batch": b, "k": k, "engine_decode_ms": step}
        parts = [f"draft cost at batch {b}: engine decode step " + (
            "-" if step is None else f"{step:.3f} ms")]  # fmt: skip
        for name, make in drafters.items():
            drafter = make(b)
            if drafter is None:  # not measured at this batch size
                continue
            ms = drafter_ms_per_position(drafter, b, prompt, model.config.vocab_size, k)
            row[f"{name}_ms_per_position"] = ms
            if step is None:
                parts.append(f"{name} {ms:.3f} ms/position")
                continue
            row[f"{name}_x_engine_step"] = ms / step
            parts.append(f"{name} {ms:.3f} ms/position ({ms / step:.2f}x)")
        rows.append(row)
        print("; ".join(parts), flush=True)
    return rows
