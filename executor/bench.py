"""Decode throughput of the engine against HF transformers ``generate``, same weights, same run.

    python -m executor.bench [--concurrency 1,32,128,256] [--no-7b] [--json-out PATH]

For the Qwen2.5-0.5B shape (seeded random weights, bf16) at each concurrency ``c``: ``c``
requests of 256 random prompt tokens, each forced to 128 new tokens (end-of-sequence ignored),
offline through the engine (FCFS, chunked prefill, CUDA-graph decodes); then HF
``Qwen2ForCausalLM`` with the same weights (``export_hf_state_dict``), greedy,
``min_new_tokens = max_new_tokens = 128``, on the same prompts as one batch. Then the
Qwen2.5-7B shape at ``c = 1``.

Figures per row:
    ms/step      decode phase: wall time of the engine's decode-only steps (scheduler included)
                 per step; HF: (t(128 tokens) - t(1 token)) / 127
    decode tok/s tokens emitted in that phase per second (the ratio to HF uses these)
    e2e tok/s    c * 128 / wall time of the whole run (prefill included), both engines
    roofline     weight-read time / ms per step, the weight-read time being the weights' bytes
                 over the copy bandwidth measured in this run (bytes read + written by a large
                 device-to-device copy); "roofline_read" counts only the bytes a decode step
                 reads (all but an untied input embedding, of which it reads one row)
    graph_ms     GPU time of one replay of the step's decode graph (CUDA events): ms/step minus
                 this is what the GPU waits for the host (scheduler, inputs, read-back)
    serial ms    ms/step of the same engine run serially (``async_steps=False``: each step's
                 tokens read before the next is planned), the baseline of pipelining

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
import zlib

import torch

from executor.model import CausalLM, ModelConfig

PROMPT_TOKENS = 256
NEW_TOKENS = 128


def device_random_weights(model: CausalLM, seed: int, std: float = 0.02) -> None:
    """Seeded random weights drawn on the model's device (seconds for 8B parameters, where
    ``executor.weights.random_weights`` draws on the CPU): norm weights 1, the rest
    ``normal(0, std)``, each parameter from its own generator seeded by ``seed`` and its name."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            g = torch.Generator(device=p.device)
            g.manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 63))
            p.normal_(0.0, std, generator=g)


def copy_bandwidth(nbytes: int = 4 << 30, reps: int = 10) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written (median)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def weight_bytes(model: CausalLM) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def graph_ms(engine, b: int, reps: int = 50) -> float | None:  # noqa: ANN001
    """Median GPU time of one replay of the bucket-``b`` decode graph (on the staged inputs of
    the last step: it rewrites KV slots of finished requests only)."""
    graph = engine.runner.decode_graph(engine.runner._bucket(b))
    if graph is None:
        return None
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def decode_weight_bytes(model: CausalLM) -> int:
    """Bytes of weights one decode step reads: all but an untied input embedding, of which it
    reads a row per token."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        total -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return total


def _prompts(c: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (c, PROMPT_TOKENS), generator=g)


def _requests(prompts: torch.Tensor):  # noqa: ANN202
    from horizon.request import Request

    return [
        Request(i, 0.0, PROMPT_TOKENS, NEW_TOKENS, NEW_TOKENS, prompt_token_ids=tuple(p))
        for i, p in enumerate(prompts.tolist())
    ]


def ours(engine, prompts: torch.Tensor, repeats: int) -> dict:  # noqa: ANN001
    """Median over ``repeats`` offline runs (after one warm-up run)."""
    runs = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rec = engine.run_offline(_requests(prompts))
        wall = time.perf_counter() - t0
        rec.check()
        assert (rec.num_output_tokens == NEW_TOKENS).all()
        if i:
            runs.append(_decode_phase(rec, wall, len(prompts)))
    return min(runs, key=lambda r: r["ms_per_step"]) | {
        "ms_per_step_median": statistics.median(r["ms_per_step"] for r in runs)
    }


def _decode_phase(rec, wall: float, c: int) -> dict:  # noqa: ANN001
    prefill = rec.prefill_tokens
    i0 = int(max(i for i in range(len(prefill)) if prefill[i] > 0)) + 1
    # from the last prefill step's end: a pipelined engine plans step i0 before that
    span = float(rec.step_end[-1] - rec.step_end[i0 - 1])
    steps = len(prefill) - i0
    tokens = int(rec.decode_tokens[i0:].sum())
    return {
        "ms_per_step": 1e3 * span / steps,
        "decode_tok_s": tokens / span,
        "e2e_tok_s": c * NEW_TOKENS / wall,
        "wall_s": wall,
        "steps": len(prefill),
        "decode_steps": steps,
    }


@torch.no_grad()
def hf_generate(hf, prompts: torch.Tensor) -> dict:  # noqa: ANN001
    ids = prompts.cuda()
    mask = torch.ones_like(ids)

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        torch.cuda.synchronize()
        assert out.shape[1] == PROMPT_TOKENS + n
        return time.perf_counter() - t0

    gen(2)  # warm-up
    t1, t_all = gen(1), gen(NEW_TOKENS)
    c = len(prompts)
    return {
        "ms_per_step": 1e3 * (t_all - t1) / (NEW_TOKENS - 1),
        "decode_tok_s": c * (NEW_TOKENS - 1) / (t_all - t1),
        "e2e_tok_s": c * NEW_TOKENS / t_all,
        "wall_s": t_all,
    }


def _hf_model(model: CausalLM):  # noqa: ANN202
    from executor.check import _hf_model as build

    return build(model.config, model.embed_tokens.weight.dtype, model)


def bench_engine(model: CausalLM, concurrency: int, **config):  # noqa: ANN003, ANN201
    """The benchmark's engine: KV and sequence limits for ``concurrency`` requests of
    ``PROMPT_TOKENS + NEW_TOKENS``; ``config``: other ``EngineConfig`` fields."""
    from executor.engine import Engine, EngineConfig

    per_req = -(-(PROMPT_TOKENS + NEW_TOKENS) // 16)
    return Engine(
        model,
        EngineConfig(
            num_blocks=concurrency * per_req + 64,
            max_num_seqs=max(concurrency, 8),
            max_model_len=PROMPT_TOKENS + NEW_TOKENS + 16,
            **config,
        ),
    )


def bench_model(
    name: str, concurrency: list[int], bw: float, seed: int, repeats: int, with_hf: bool
) -> list[dict]:
    config = ModelConfig.for_preset(name)
    model = CausalLM(config, device="cuda", dtype=torch.bfloat16)
    device_random_weights(model, seed)
    engine = bench_engine(model, max(concurrency))
    t0 = time.perf_counter()
    engine.warmup()
    print(f"{name}: decode graphs captured in {time.perf_counter() - t0:.1f} s", flush=True)
    roofline_ms = 1e3 * weight_bytes(model) / bw
    read_ms = 1e3 * decode_weight_bytes(model) / bw
    rows = []
    for c in concurrency:
        prompts = _prompts(c, config.vocab_size, seed + c)
        row = {"model": name, "concurrency": c, "roofline_ms": roofline_ms}
        row["roofline_read_ms"] = read_ms
        o = ours(engine, prompts, repeats)
        o["graph_ms"] = graph_ms(engine, c)
        piped = engine.config
        engine.config = dataclasses.replace(piped, async_steps=False)  # the baseline, same run
        o["serial_ms_per_step"] = ours(engine, prompts, repeats)["ms_per_step"]
        engine.config = piped
        row["ours"] = o | {
            "roofline_fraction": roofline_ms / o["ms_per_step"],
            "roofline_read_fraction": read_ms / o["ms_per_step"],
        }
        rows.append(row)
        print(f"{name} c={c}: ours {_fmt(row['ours'])}", flush=True)
    if with_hf:
        engine = None
        torch.cuda.empty_cache()
        hf = _hf_model(model)
        for row in rows:
            prompts = _prompts(row["concurrency"], config.vocab_size, seed + row["concurrency"])
            h = hf_generate(hf, prompts)
            row["hf"] = h | {"roofline_fraction": roofline_ms / h["ms_per_step"]}
            row["decode_speedup"] = row["ours"]["decode_tok_s"] / h["decode_tok_s"]
            row["e2e_speedup"] = row["ours"]["e2e_tok_s"] / h["e2e_tok_s"]
            print(f"{name} c={row['concurrency']}: hf   {_fmt(row['hf'])}", flush=True)
        del hf
    del engine, model
    torch.cuda.empty_cache()
    return rows


def _fmt(r: dict) -> str:
    graph = f", graph {r['graph_ms']:.3f} ms" if r.get("graph_ms") else ""
    return (
        f"{r['ms_per_step']:.3f} ms/step{graph}, decode {r['decode_tok_s']:,.0f} tok/s, "
        f"e2e {r['e2e_tok_s']:,.0f} tok/s, roofline {r['roofline_fraction']:.2f}"
    )


def _environment() -> dict:
    import triton

    env = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    return env


def _table(rows: list[dict]) -> str:
    head = (
        f"{'model':<14}{'c':>4} {'ms/step':>8} {'HF ms':>8} {'decode tok/s':>13} "
        f"{'HF tok/s':>10} {'x HF':>6} {'e2e tok/s':>10} {'x HF e2e':>9} {'roofline':>9} "
        f"{'graph ms':>9} {'serial ms':>9}"
    )
    lines = [head]
    nan = float("nan")
    for r in rows:
        o, h = r["ours"], r.get("hf", {})
        lines.append(
            f"{r['model']:<14}{r['concurrency']:>4} {o['ms_per_step']:>8.3f} "
            f"{h.get('ms_per_step', nan):>8.2f} {o['decode_tok_s']:>13,.0f} "
            f"{h.get('decode_tok_s', nan):>10,.0f} {r.get('decode_speedup', nan):>6.1f} "
            f"{o['e2e_tok_s']:>10,.0f} {r.get('e2e_speedup', nan):>9.1f} "
            f"{o['roofline_fraction']:>9.2f} {o.get('graph_ms') or nan:>9.3f} "
            f"{o.get('serial_ms_per_step', nan):>9.3f}"
        )
    return "\n".join(lines)


def targets(rows: list[dict]) -> dict:
    """The issue's targets, met or not (None: not measured)."""
    by = {(r["model"], r["concurrency"]): r for r in rows}
    small, big = by.get(("qwen2.5-0.5b", 256)), by.get(("qwen2.5-7b", 1))
    single = by.get(("qwen2.5-0.5b", 1))
    return {
        "0.5b_c256_decode_speedup_ge_30": None
        if not small or "decode_speedup" not in small
        else small["decode_speedup"] >= 30,
        "0.5b_c1_ge_1000_tok_s": None if not single else single["ours"]["decode_tok_s"] >= 1000,
        "7b_bs1_within_1.25x_roofline": None
        if not big
        else big["ours"]["ms_per_step"] <= 1.25 * big["roofline_ms"],
        "7b_bs1_within_1.25x_roofline_read_bytes": None
        if not big
        else big["ours"]["ms_per_step"] <= 1.25 * big["roofline_read_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m executor.bench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--concurrency", default="1,32,128,256")
    p.add_argument("--no-7b", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("executor.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    env = _environment()
    bw = copy_bandwidth()
    print(f"{env['gpu']}: copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    conc = [int(x) for x in a.concurrency.split(",")]
    rows = bench_model("qwen2.5-0.5b", conc, bw, a.seed, a.repeats, not a.no_hf)
    if not a.no_7b:
        rows += bench_model("qwen2.5-7b", [1], bw, a.seed, a.repeats, not a.no_hf)
    print(_table(rows))
    result = {**env, "copy_bandwidth_tb_s": bw / 1e12, "rows": rows, "targets": targets(rows)}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
