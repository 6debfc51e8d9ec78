"""``python -m executor.serve``: an OpenAI-compatible server for one model.

    python -m executor.serve --model smollm2-135m-instruct --policy fcfs --port 8000
    python -m executor.serve --model qwen2.5-7b --num-blocks 20000   # random weights, bytes
    python -m executor.serve --model qwen2.5-7b --tokenizer qwen      # ... and Qwen's BPE

Then any OpenAI client: ``OpenAI(base_url="http://localhost:8000/v1", api_key="-")``. For
forced output lengths send ``ignore_eos: true`` and ``min_tokens == max_tokens`` (the
``extra_body`` of the openai package).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from executor.engine import EngineConfig
from executor.serve.model_loading import TOKENIZERS, load_model
from horizon.policies.base import Policy
from horizon.speculation import SpeculationConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m executor.serve", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", default="smollm2-135m-instruct", help="named model, preset shape or 'tiny'"
    )
    p.add_argument(
        "--served-model-name", default=None, help="the name clients use (default: --model)"
    )
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16 (default: the model's)"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--policy", default="fcfs", help="a horizon policy name or package.module:Class")
    p.add_argument(
        "--num-blocks",
        type=int,
        default=None,
        help="KV blocks (default: from free GPU memory; 1024 on the CPU)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--max-model-len", type=int, default=None, help="default: min(4096, the model's)"
    )
    p.add_argument(
        "--max-waiting", type=int, default=1024, help="429 while this many requests wait"
    )
    p.add_argument("--attention-backend", default=None, choices=("triton", "torch"))
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="random weights' and sampling's run seed")
    p.add_argument(
        "--tokenizer",
        default="byte",
        choices=TOKENIZERS,
        help="a random-weight shape's tokenizer (named models bring their own)",
    )
    p.add_argument(
        "--records",
        default=None,
        help="write the run's records (.npz) here at exit, and beside it the Unix time of the "
        "records' clock zero (.json) and the streamed first tokens' way out (.ttft.npz)",
    )
    p.add_argument(
        "--engine",
        default="process",
        choices=("process", "thread"),
        help="the engine in a process of its own (default), or on a thread of the server's",
    )
    p.add_argument(
        "--speculation",
        type=int,
        default=0,
        help="draft tokens per request per step (n-gram prompt lookup, fixed k; 0: off)",
    )
    p.add_argument(
        "--torch-threads", type=int, default=None, help="the engine's CPU threads (default: torch)"
    )
    p.add_argument(
        "--http",
        default="auto",
        choices=("auto", "h11", "httptools"),
        help="uvicorn's HTTP parser (auto: httptools where installed)",
    )
    p.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "asyncio", "uvloop"),
        help="uvicorn's event loop (auto: uvloop where installed)",
    )
    p.add_argument("--no-access-log", action="store_true", help="no log line per request")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    return p.parse_args(argv)


def engine_config(args: argparse.Namespace, max_positions: int) -> EngineConfig:
    on_cpu = args.device == "cpu"
    return EngineConfig(
        num_blocks=args.num_blocks or (1024 if on_cpu else None),
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or min(4096, max_positions),
        enable_prefix_caching=not args.no_prefix_caching,
        attention_backend=args.attention_backend,
        cuda_graphs=False if args.no_cuda_graphs else None,
        stop="eos",
        seed=args.seed,
        speculation=_speculation(args.speculation),
    )


def _speculation(k: int) -> SpeculationConfig | None:
    if k < 0:
        raise ValueError(f"--speculation must be >= 0 draft tokens, got {k}")
    return SpeculationConfig(policy="fixed", num_draft_tokens=k) if k else None


def main(argv: list[str] | None = None, policy: Policy | None = None) -> int:
    """The server of ``argv``'s options; ``policy``: a fresh policy object instead of
    ``--policy`` (``experiments.serve`` builds one from the project's config groups)."""
    import uvicorn

    args = parse_args(argv)
    try:
        server = _build(args, policy)
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # a wrong name, no weights
        print(f"error: {e}", file=sys.stderr)
        return 2
    live = server.live
    print(
        f"serving {server.model_name} on http://{args.host}:{args.port}/v1 "
        f"({type(policy).__name__ if policy is not None else args.policy}, "
        f"engine in {'its own process' if args.engine == 'process' else 'a thread'})",
        flush=True,
    )
    try:
        uvicorn.run(
            server.app,
            host=args.host,
            port=args.port,
            log_level="info",
            http=args.http,
            loop=args.loop,
            access_log=not args.no_access_log,
        )
    finally:
        live.close()
        if args.records:
            _save_records(server, args.records)
    return 0 if live.error is None else 1


def _build(args: argparse.Namespace, policy: Policy | None):  # noqa: ANN202
    """The server, its engine started and warmed up (CUDA graphs captured on the engine's
    own thread)."""
    from executor.serve.server import build_server, start_process_server

    name = args.served_model_name or args.model
    if args.engine == "process":
        from executor.serve.engine_child import EngineSpec
        from executor.serve.model_loading import max_positions

        config = engine_config(args, max_positions(args.model))
        spec = EngineSpec(
            args.model, config, args.dtype, args.device, args.seed, args.tokenizer,
            policy or args.policy, args.torch_threads,
        )  # fmt: skip
        return start_process_server(spec, name, args.max_waiting)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model, tokenizer = load_model(args.model, args.dtype, args.device, args.seed, args.tokenizer)
    config = engine_config(args, model.config.max_position_embeddings)
    server = build_server(model, tokenizer, config, name, policy or args.policy, args.max_waiting)
    server.start()
    return server


def _save_records(server, path: str) -> None:  # noqa: ANN001
    """The records (``path``); their clock's zero as Unix time and as ``perf_counter`` (``path``
    with ``.json``: what lines them up with a load generator's timestamps); the streamed
    requests' first-token moments (``path`` with ``.ttft.npz``, ``executor.serve.ttft_trace``)."""
    live = server.live
    live.records().save_npz(path)
    zero = time.time() - (time.perf_counter() - live.clock_start)
    stem = os.path.splitext(path)[0]
    with open(stem + ".json", "w") as f:
        json.dump({"clock_zero_unix_s": zero, "clock_zero_perf_s": live.clock_start}, f)
    server.hub.trace.save_npz(stem + ".ttft.npz", live.clock_start)
    print(f"records: {path}, {stem}.ttft.npz")


if __name__ == "__main__":
    sys.exit(main())
