"""HTTP serving against the offline engine on the same requests (not a test).

    python -m executor.serve.bench --model qwen2.5-0.5b --concurrency 1,16,64,256 \
        --json-out serve_bench.json

Every request has a random ``--prompt-len``-token prompt and is forced to ``--output-len``
tokens (``ignore_eos``, ``min_tokens == max_tokens``; greedy), and prefix caching is off (one
server serves every level the same prompts; an offline run warms up on some of them), so every
path does the same work.

* throughput, per concurrency ``c``: ``--requests`` requests through ``c`` concurrent
  streams of the server (a closed loop: each stream sends its next request when one ends; the
  client runs in its own process), against the offline engine with all of them queued at
  once and ``max_num_seqs = c``, pipelined (its default: ``async_steps`` on) and serial (as
  the server steps: a step's tokens read before the next is planned). Generated tokens per
  second of wall time.
* latency at low load: ``--low-load-requests`` requests one at a time (``--low-load-output``
  tokens each); p50 TTFT as the HTTP client sees it (request sent to first chunk read) and
  offline (a one-request run's first token).

Prints a table; ``--json-out`` gets every figure. ``--engine`` names the servers measured:
``process`` (the engine in a process of its own, the server's default) and ``thread`` (the
engine on a thread of the server's process); uvicorn runs in this process. Model, policy and
engine options are the same for every path.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from executor.engine import Engine, EngineConfig
from executor.serve.model_loading import load_model
from horizon.request import Request


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m executor.serve.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default="qwen2.5-0.5b", help="named model, preset shape or 'tiny'")
    p.add_argument("--dtype", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated stream counts")
    p.add_argument("--requests", type=int, default=256, help="requests per concurrency level")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--low-load-requests", type=int, default=16)
    p.add_argument("--low-load-output", type=int, default=16)
    p.add_argument(
        "--num-blocks", type=int, default=None, help="default: what the largest level needs"
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--attention-backend", default=None, choices=("triton", "torch"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--torch-threads", type=int, default=None, help="CPU threads (1 suits a tiny model)"
    )
    p.add_argument(
        "--engine", default="process", help="comma-separated: process, thread (servers measured)"
    )
    p.add_argument(
        "--client-procs", type=int, default=4, help="client processes sharing the streams"
    )
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def engine_config(args: argparse.Namespace, max_num_seqs: int, **kw) -> EngineConfig:
    length = args.prompt_len + max(args.output_len, args.low_load_output)
    cmax = max(_levels(args))
    blocks = args.num_blocks or (cmax * (-(-length // args.block_size) + 1) + 16)
    return EngineConfig(
        num_blocks=blocks,
        block_size=args.block_size,
        max_num_batched_tokens=max(args.max_num_batched_tokens, max_num_seqs),
        max_num_seqs=max_num_seqs,
        max_model_len=length,
        attention_backend=args.attention_backend,
        enable_prefix_caching=False,  # every path computes every prompt: the same work
        seed=args.seed,
        **kw,
    )


def _levels(args: argparse.Namespace) -> list[int]:
    return [int(c) for c in str(args.concurrency).split(",") if c]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (n, length)).tolist()


def offline(model, args, ids: list[list[int]], out: int, c: int, pipelined: bool) -> dict:  # noqa: ANN001
    """Tokens/s of one offline run of ``ids`` at ``max_num_seqs = c``."""
    engine = Engine(model, engine_config(args, c, stop="trace", async_steps=pipelined))
    engine.warmup()
    engine.run_offline(_requests(ids[: min(len(ids), c)], out))  # warm
    start = time.perf_counter()
    rec = engine.run_offline(_requests(ids, out))
    wall = time.perf_counter() - start
    return {"tok_s": int(rec.num_output_tokens.sum()) / wall}


def offline_low_load(model, args, ids: list[list[int]]) -> float:  # noqa: ANN001
    """p50 TTFT of one-request offline runs."""
    engine = Engine(model, engine_config(args, 1, stop="trace"))
    engine.warmup()
    ttft = []
    for i, p in enumerate([ids[0], *ids]):
        rec = engine.run_offline(_requests([p], args.low_load_output))
        if i:  # the first run warms up
            ttft.append(rec.tokens_of(0)[0] - rec.arrival_time[0])
    return statistics.median(ttft)


def _requests(ids: list[list[int]], out: int) -> list[Request]:
    return [Request(i, 0.0, len(p), out, out, prompt_token_ids=tuple(p)) for i, p in enumerate(ids)]


def http(url: str, ids: list[list[int]], out: int, c: int, procs: int = 1) -> dict:
    """Tokens/s and client-side p50 TTFT and ITL of ``ids`` through ``c`` streams (the client
    in ``procs`` spawned processes, the streams and requests shared out among them), and the
    transport errors their retries met."""
    body = {"max_tokens": out, "min_tokens": out, "ignore_eos": True, "temperature": 0}
    body.update(stream=True, stream_options={"include_usage": True})
    bodies = [{**body, "prompt": p} for p in ids]
    k = max(1, min(procs, c))
    results = _clients(
        url, [bodies[i::k] for i in range(k)], [len(range(i, c, k)) for i in range(k)]
    )
    timings = [t for r in results for t in r["timings"]]
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    tokens = sum(t["num_tokens"] for t in timings)
    ttft = [t["token_times"][0] - t["sent"] for t in timings]
    itl = [b - a for t in timings for a, b in zip(t["token_times"], t["token_times"][1:])]
    return {
        "tok_s": tokens / wall,
        "ttft_p50_s": statistics.median(ttft),
        "itl_p50_s": statistics.median(itl) if itl else float("nan"),
        "tokens": tokens,
        "expected_tokens": len(ids) * out,
        "client_procs": k,
        "transport_errors": [e for r in results for e in r["transport_errors"]],
    }


def _clients(url: str, shares: list[list[dict]], streams: list[int]) -> list[dict]:
    """One ``bench_client`` process per share, all at once; their results."""
    cmd = [sys.executable, "-m", "executor.serve.bench_client"]
    pipe = subprocess.PIPE
    procs = [subprocess.Popen(cmd, stdin=pipe, stdout=pipe, stderr=pipe, text=True) for _ in shares]
    for p, share, n in zip(procs, shares, streams):
        p.stdin.write(json.dumps({"url": url, "bodies": share, "concurrency": n}))
        p.stdin.close()
    outs = [(p.stdout.read(), p.stderr.read(), p.wait()) for p in procs]
    failed = [err for _, err, rc in outs if rc]
    if failed:
        raise RuntimeError(f"the benchmark client failed:\n{failed[0]}")
    return [json.loads(out) for out, _, _ in outs]


def served(model, tokenizer, args, mode, ids, low) -> tuple[dict, dict]:  # noqa: ANN001
    """The HTTP figures of one server (``mode``: process or thread): per concurrency level,
    and at low load. The server (its KV tensor with it) is gone when this returns."""
    from executor.serve.engine_child import EngineSpec
    from executor.serve.server import ServerThread, build_server, start_process_server

    levels = _levels(args)
    config = engine_config(args, max(levels))
    waiting = max(args.requests, 1) + 16
    if mode == "process":
        spec = EngineSpec(
            args.model,
            config,
            args.dtype,
            args.device,
            args.seed,
            policy=args.policy,
            torch_threads=args.torch_threads,
        )
        server = start_process_server(spec, args.model, waiting)
    else:
        server = build_server(model, tokenizer, config, args.model, args.policy, waiting)
        server.start()
    thread = ServerThread(server.app)
    thread.start()
    try:
        http(thread.url, low[:2], args.low_load_output, 1)  # warm
        low_http = http(thread.url, low, args.low_load_output, 1)
        rows = {c: http(thread.url, ids, args.output_len, c, args.client_procs) for c in levels}
    finally:
        thread.stop()
        server.live.close()
    return rows, low_http


def _modes(args: argparse.Namespace) -> list[str]:
    modes = [m for m in str(args.engine).split(",") if m]
    bad = [m for m in modes if m not in ("process", "thread")]
    if bad or not modes:
        raise ValueError(f"engine: {bad or modes!r}; a comma-separated list of process, thread")
    return modes


def run(args: argparse.Namespace) -> dict:
    """Every figure of the benchmark (see the module docstring)."""
    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model, tokenizer = load_model(args.model, args.dtype, args.device, args.seed)
    vocab = model.config.vocab_size
    ids = prompts(args.requests, args.prompt_len, vocab, args.seed)
    low = prompts(args.low_load_requests, args.prompt_len, vocab, args.seed + 1)
    by_mode = {m: served(model, tokenizer, args, m, ids, low) for m in _modes(args)}
    _free_all()
    rows = []
    for c in _levels(args):
        row = {"concurrency": c, "http": {m: r[0][c] for m, r in by_mode.items()}}
        row["offline"] = offline(model, args, ids, args.output_len, c, pipelined=None)
        _free_all()  # each run's KV tensor before the next one's
        row["offline_serial"] = offline(model, args, ids, args.output_len, c, pipelined=False)
        _free_all()
        rows.append(row)
    low_offline = offline_low_load(model, args, low)
    return {
        "model": args.model,
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "policy": args.policy,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "requests": args.requests,
        "rows": rows,
        "low_load": {
            "requests": args.low_load_requests,
            "output_len": args.low_load_output,
            "http_ttft_p50_s": {m: r[1]["ttft_p50_s"] for m, r in by_mode.items()},
            "offline_ttft_p50_s": low_offline,
        },
    }


def _free_all() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def table(result: dict) -> str:
    lines = [
        f"{result['model']} on {result['device_name']}, {result['policy']}, "
        f"{result['requests']} requests of {result['prompt_len']} + {result['output_len']} tokens",
        f"{'streams':>8} {'engine':>8} {'http tok/s':>11} {'offline tok/s':>14} "
        f"{'serial tok/s':>13} {'http/offline':>13} {'http TTFT p50':>14} {'http ITL p50':>13} "
        "retried",
    ]
    for r in result["rows"]:
        o, s = r["offline"], r["offline_serial"]
        for mode, h in r["http"].items():
            lines.append(
                f"{r['concurrency']:>8} {mode:>8} {h['tok_s']:>11.1f} {o['tok_s']:>14.1f} "
                f"{s['tok_s']:>13.1f} {h['tok_s'] / o['tok_s']:>13.2f} "
                f"{h['ttft_p50_s'] * 1e3:>11.1f} ms {h['itl_p50_s'] * 1e3:>10.2f} ms "
                f"{len(h['transport_errors']):>7}"
            )
    low = result["low_load"]
    http_ttft = ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in low["http_ttft_p50_s"].items())
    lines.append(
        f"low load ({low['requests']} requests one at a time, {low['output_len']} tokens): "
        f"p50 TTFT http {http_ttft}, offline {low['offline_ttft_p50_s'] * 1e3:.1f} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
