"""Step profiler: measured step times over a grid of plan shapes, for the simulator's cost model.

    python -m executor.profiler --model qwen2.5-0.5b --out calibration/h200_qwen2.5-0.5b.csv

Each shape (decode batch and context, prefill chunk and cached prefix, mixes of both, several
chunks) is made of synthetic requests whose counters, token histories and block tables are set
directly, then executed by the real ``ModelRunner`` (CUDA graphs for decode-only steps, eager
otherwise) without committing tokens, so the same step repeats. A step's time is the wall time
of ``ModelRunner.execute`` (host preparation, copy, forward, sampling, read-back), what the
engine's ``StepResult.duration`` measures; the scheduler's own time is not in it.

The CSV has one row per shape with the plan fields the simulator's cost model reads
(``num_prefill_tokens, num_decodes, decode_context_tokens, prefill_context_tokens,
prefill_attention_pairs, num_prefills``, defined as in ``horizon.plan.StepPlan``), the median
``step_s`` and its 10th/90th percentiles, the shape's kind and whether a CUDA graph ran it. A
sidecar ``<out>.json`` records the GPU, model shape, dtype, versions, date and commit.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from executor.kernels import allocate_kv_cache
from executor.model import CausalLM, ModelConfig
from executor.runner import GRAPH_BATCH_SIZES, ModelRunner
from horizon.plan import PLAN_SHAPE_FIELDS, StepPlan
from horizon.request import Request

COLUMNS = (
    *PLAN_SHAPE_FIELDS,
    "step_s",
    "step_s_p10",
    "step_s_p90",
    "kind",
    "cuda_graph",
)
DECODE_BATCHES = GRAPH_BATCH_SIZES
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4096)
PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024, 1536, 2048)
PREFILL_PREFIXES = (0, 1024, 3072)
MIXED_DECODES = (1, 16, 64, 128, 240)
MIXED_CONTEXTS = (512, 2048)


@dataclass(frozen=True)
class Shape:
    """A step: decodes with these contexts (tokens in context including the new one) and
    prefill chunks ``(cached prefix, tokens)``."""

    kind: str
    decode_contexts: tuple[int, ...] = ()
    chunks: tuple[tuple[int, int], ...] = ()

    def num_blocks(self, block_size: int) -> int:
        """KV blocks the shape's requests hold."""
        lengths = (*self.decode_contexts, *(p + n for p, n in self.chunks))
        return sum(-(-t // block_size) for t in lengths)


def grid(max_num_batched_tokens: int = 2048, max_num_seqs: int = 256) -> list[Shape]:
    """The default grid: decode-only, prefill-only (with cached prefixes), mixed, multi-chunk."""
    budget = max_num_batched_tokens
    shapes = [
        Shape("decode", (c,) * b)
        for c in DECODE_CONTEXTS
        for b in DECODE_BATCHES
        if b <= max_num_seqs
    ]
    shapes += [
        Shape("prefill", (), ((p, n),))
        for p in PREFILL_PREFIXES
        for n in PREFILL_TOKENS
        if n <= budget
    ]
    for d in MIXED_DECODES:
        if d >= max_num_seqs:
            continue
        for c in MIXED_CONTEXTS:
            for n in sorted({128, 512, budget - d}):
                if 0 < n <= budget - d:
                    shapes.append(Shape("mixed", (c,) * d, ((0, n),)))
    for k in (2, 4, 8):
        shapes.append(Shape("prefill", (), ((0, budget // k),) * k))
    return shapes


def plan_of(step: int, decodes: Sequence[Request], prefills: Sequence[tuple[Request, int]]):  # noqa: ANN201
    """A ``StepPlan`` with its shape fields computed as ``Scheduler.schedule`` does."""
    pairs = sum(n * r.num_computed_tokens + n * (n + 1) // 2 for r, n in prefills)
    return StepPlan(
        step=step,
        time=0.0,
        decodes=tuple(decodes),
        prefills=tuple(prefills),
        num_prefill_tokens=sum(n for _, n in prefills),
        decode_context_tokens=sum(r.num_computed_tokens for r in decodes),
        prefill_attention_pairs=pairs,
        prefill_context_tokens=sum(r.num_computed_tokens + n for r, n in prefills),
    )


class StepProfiler:
    """Builds each shape's synthetic requests on ``runner`` and times its step."""

    def __init__(self, runner: ModelRunner, seed: int = 0) -> None:
        self.runner = runner
        self.num_blocks = runner.attention.k_caches[0].shape[0]
        self._rng = np.random.default_rng(seed)
        self._vocab = runner.model.config.vocab_size
        self._step = 0

    def _sync(self) -> None:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)

    def _ids(self, n: int) -> list[int]:
        return self._rng.integers(0, self._vocab, n).tolist()

    def build(self, shape: Shape, first_id: int = 0, first_block: int = 0):  # noqa: ANN201
        """(plan, block tables) of ``shape``, its requests started on the runner, their ids
        from ``first_id`` and their blocks from ``first_block`` (two shapes built at once
        need apart ids and blocks). Raises ValueError, having started none, for a shape
        whose blocks do not fit the cache."""
        bs, tables, block = self.runner.block_size, {}, first_block
        need = first_block + shape.num_blocks(bs)
        if need > self.num_blocks:
            raise ValueError(f"shape needs {need} KV blocks, the cache has {self.num_blocks}")
        decodes, prefills = [], []

        def take(rid: int, tokens: int) -> None:
            nonlocal block
            n = -(-tokens // bs)
            tables[rid] = list(range(block, block + n))
            block += n

        for c in shape.decode_contexts:  # prompt c - 1 tokens, one token emitted: decodes at c
            r = Request(first_id + len(tables), 0.0, c - 1, 2, 2)
            r.advance(c - 1)
            self.runner.start(r, self._ids(c - 1), generated=self._ids(1))
            take(r.request_id, c)
            decodes.append(r)
        for prefix, n in shape.chunks:
            r = Request(first_id + len(tables), 0.0, prefix + n, 2, 2)
            r.set_computed(prefix)
            self.runner.start(r, self._ids(prefix + n))
            take(r.request_id, prefix + n)
            prefills.append((r, n))
        self._step += 1
        return plan_of(self._step, decodes, prefills), tables

    def measure(self, shape: Shape, repeats: int = 10, warmup: int = 2) -> dict:
        """One CSV row: the shape's plan fields and its step times."""
        plan, tables = self.build(shape)
        blocks_of = tables.__getitem__
        times = []
        try:
            for i in range(warmup + repeats):
                self._sync()
                t0 = time.perf_counter()
                self.runner.execute(plan, lambda r: blocks_of(r.request_id), commit=False)
                self._sync()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
        finally:
            for r in (*plan.decodes, *(r for r, _ in plan.prefills)):
                self.runner.release(r)
        return {
            "num_prefill_tokens": plan.num_prefill_tokens,
            "num_decodes": len(plan.decodes),
            "decode_context_tokens": plan.decode_context_tokens,
            "prefill_context_tokens": plan.prefill_context_tokens,
            "prefill_attention_pairs": plan.prefill_attention_pairs,
            "num_prefills": len(plan.prefills),
            "step_s": float(np.median(times)),
            "step_s_p10": float(np.percentile(times, 10)),
            "step_s_p90": float(np.percentile(times, 90)),
            "kind": shape.kind,
            "cuda_graph": bool(
                self.runner.cuda_graphs
                and (self.runner.mixed_graphs if plan.prefills else len(plan.decodes) > 0)
            ),
        }


def write_csv(rows: Iterable[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in row.items()})


def stamp(model: CausalLM, runner: ModelRunner, extra: dict) -> dict:
    """What the sidecar JSON records about where and how the CSV was measured."""
    import triton

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "model": model.config.name,
        "shape": dataclasses.asdict(model.config.shape),
        "dtype": str(model.embed_tokens.weight.dtype).removeprefix("torch."),
        "block_size": runner.block_size,
        "attention_backend": runner.backend,
        "cuda_graphs": runner.cuda_graphs,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "step_s": "median wall time of ModelRunner.execute (host prep, H2D copy, forward, "
        "sampling, read-back); the scheduler's time is not included",
        "columns": "as horizon.plan.StepPlan: decode_context_tokens = sum of the decodes' "
        "num_computed_tokens; prefill_context_tokens = sum of chunk end positions; "
        "prefill_attention_pairs = sum of n*C + n*(n+1)/2",
        **extra,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m executor.profiler", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", default="qwen2.5-0.5b", help="a preset name")
    p.add_argument("--out", required=True, type=Path, help="CSV path; the sidecar is <out>.json")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-kv-gib", type=float, default=70.0, help="cap on the KV tensor")
    p.add_argument("--quick", action="store_true", help="every other shape, 5 repeats")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    if not torch.cuda.is_available():
        print("executor.profiler needs a CUDA GPU", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    shapes = grid(a.max_num_batched_tokens, a.max_num_seqs)
    if a.quick:
        shapes, a.repeats = shapes[::2], 5
    model, runner, num_blocks = _setup(a, shapes)
    prof = StepProfiler(runner, a.seed)
    rows, skipped = [], 0
    for s in shapes:
        if s.num_blocks(a.block_size) > num_blocks:
            skipped += 1
            continue
        rows.append(prof.measure(s, a.repeats))
    write_csv(rows, a.out)
    meta = stamp(
        model,
        runner,
        {
            "repeats": a.repeats,
            "warmup": 2,
            "num_kv_blocks": num_blocks,
            "shapes_skipped_for_kv": skipped,
            "max_num_batched_tokens": a.max_num_batched_tokens,
            "max_num_seqs": a.max_num_seqs,
            "weights": f"device_random_weights(seed={a.seed})",
            "command": "python -m executor.profiler " + " ".join(argv or sys.argv[1:]),
            "seconds": round(time.perf_counter() - t_start, 1),
        },
    )
    a.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    _print_summary(a.model, rows, skipped, a.out)
    return 0


def _setup(a: argparse.Namespace, shapes: Sequence[Shape]) -> tuple[CausalLM, ModelRunner, int]:
    """The model (random weights), a KV cache for the largest shape (capped at ``--max-kv-gib``)
    and a runner with its graphs captured; returns them and the cache's block count."""
    from executor.bench import device_random_weights
    from executor.engine import kv_block_bytes

    config = ModelConfig.for_preset(a.model)
    model = CausalLM(config, device="cuda", dtype=getattr(torch, a.dtype))
    device_random_weights(model, a.seed)
    bs = a.block_size
    block_bytes = kv_block_bytes(model, bs)
    cap = int(a.max_kv_gib * 2**30 // block_bytes)
    need = max(s.num_blocks(bs) for s in shapes)
    num_blocks = min(need, cap)
    c = model.config
    kv = allocate_kv_cache(
        c.num_layers,
        num_blocks,
        bs,
        c.num_kv_heads,
        c.head_dim,
        model.embed_tokens.weight.dtype,
        "cuda",
    )
    max_len = max(PREFILL_PREFIXES) + a.max_num_batched_tokens + max(DECODE_CONTEXTS)
    runner = ModelRunner(model, kv, a.max_num_seqs, a.max_num_batched_tokens, max_len)
    runner.capture_graphs()
    return model, runner, num_blocks


def _print_summary(model: str, rows: list[dict], skipped: int, out: Path) -> None:
    """A sample of the measured rows: some decode shapes, then some others."""
    dec = [r for r in rows if r["kind"] == "decode"]
    print(f"{model}: {len(rows)} shapes ({skipped} skipped for KV) -> {out}")
    for r in dec[:: max(1, len(dec) // 8)] + [r for r in rows if r["kind"] != "decode"][::6]:
        print(
            f"  {r['kind']:<8} prefill {r['num_prefill_tokens']:>5} decodes {r['num_decodes']:>4} "
            f"ctx {r['decode_context_tokens'] + r['prefill_context_tokens']:>8}  "
            f"{1e3 * r['step_s']:8.3f} ms"
        )


if __name__ == "__main__":
    sys.exit(main())
