"""Mixed-step CUDA graphs against the eager path, on the GPU, in one call:

    python -m executor.graph_check [--model qwen2.5-0.5b] [--json-out F]

The same offline batch (random prompts of 20-900 tokens in 2048-token chunked steps, outputs
forced to 24-96 tokens) runs on one engine with every step replayed from graphs and on one whose
steps with prefill chunks run eagerly (decode-only steps are graphed in both). Reports, per
dtype: the share of requests whose generated tokens are identical (fp32: padding changes GEMM
shapes, so tokens may differ only where logits tie within rounding; bf16 shown for reference)
and the mean and median wall time of the steps with prefill chunks in each engine. Its LAST
line is one JSON object. fp32 must be identical; bf16 is not expected to be: padding changes the
GEMMs' shapes, hence possibly cuBLAS's kernel and summation order, and random weights leave
top-2 logits within a bf16 ulp often enough that some greedy sequences diverge.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from executor.bench import device_random_weights
from executor.engine import Engine, EngineConfig
from executor.model import CausalLM, ModelConfig
from horizon.request import Request


def _requests(n: int, vocab: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(20, 900))
        o = int(rng.integers(24, 96))
        ids = tuple(rng.integers(0, vocab, p).tolist())
        out.append(Request(i, 0.0, p, o, o, prompt_token_ids=ids))
    return out


def _run(engine: Engine, n: int, vocab: int, seed: int) -> tuple[dict, np.ndarray]:
    engine.run_offline(_requests(n, vocab, seed))  # warm-up
    rec = engine.run_offline(_requests(n, vocab, seed))
    rec.check()
    mixed = rec.prefill_tokens > 0
    return dict(engine.outputs), rec.step_durations()[mixed]


def check(model_name: str, dtype: torch.dtype, n: int, seed: int) -> dict:
    cfg = ModelConfig.for_preset(model_name)
    model = CausalLM(cfg, device="cuda", dtype=dtype)
    device_random_weights(model, seed=0)
    row: dict = {"model": model_name, "dtype": str(dtype).removeprefix("torch.")}
    outs, times = {}, {}
    for name, mixed in (("graphs", True), ("eager_mixed", False)):
        e = Engine(model, EngineConfig(num_blocks=8192, max_model_len=2048, mixed_graphs=mixed))
        e.warmup()
        outs[name], t = _run(e, n, cfg.vocab_size, seed)
        times[name] = t
        row[f"{name}_mixed_steps"] = len(t)
        row[f"{name}_mixed_ms_mean"] = 1e3 * float(t.mean())
        row[f"{name}_mixed_ms_median"] = 1e3 * float(np.median(t))
        del e
        torch.cuda.empty_cache()
    a, b = outs["graphs"], outs["eager_mixed"]
    row["requests_identical"] = sum(a[k] == b[k] for k in a) / len(a)
    tok = [(x == y) for k in a for x, y in zip(a[k], b[k])]
    row["tokens_identical"] = float(np.mean(tok))
    row["mixed_speedup"] = row["eager_mixed_mixed_ms_mean"] / row["graphs_mixed_ms_mean"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m executor.graph_check")
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("executor.graph_check needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [check(a.model, dt, a.requests, a.seed) for dt in (torch.float32, torch.bfloat16)]
    print("dtype     requests=  tokens=   mixed ms graph / eager (mean, median)   speed-up")
    for r in rows:
        print(
            f"{r['dtype']:9s} {r['requests_identical']:.3f}     {r['tokens_identical']:.4f}    "
            f"{r['graphs_mixed_ms_mean']:.2f} / {r['eager_mixed_mixed_ms_mean']:.2f}   "
            f"({r['graphs_mixed_ms_median']:.2f} / {r['eager_mixed_mixed_ms_median']:.2f})"
            f"      {r['mixed_speedup']:.2f}x"
        )
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=2)
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
