"""A long run against a live server: ``--streams`` closed-loop streams of forced-length
completions for ``--duration`` seconds, then the server's gauges (not a test).

    python -m executor.serve.soak --url http://127.0.0.1:8000 --streams 256 --duration 600

Each stream sends a random ``--prompt-len``-token prompt forced to ``--output-len`` tokens
(``ignore_eos``, ``min_tokens == max_tokens``), reads the stream to its end and sends the next,
until the deadline; a tenth of the requests are dropped mid-stream by the client (a disconnect
the server must abort). Once every stream has stopped and the server is idle it prints
completed and dropped counts, tokens/s, and ``/metrics``' running, waiting and KV usage; the
exit status is 1 unless all three are zero (every block free).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time

import httpx

from executor.serve.bench_client import one_connection_clients


async def _stream(client: httpx.AsyncClient, body: dict, drop_after: int | None) -> int:
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                tokens += len(json.loads(line[6:]).get("choices", ()))
                if drop_after is not None and tokens >= drop_after:
                    return -tokens  # the client goes away mid-stream
    return tokens


async def _worker(client, args, rng: random.Random, deadline: float, tally: dict) -> None:
    while time.monotonic() < deadline:
        body = {
            "model": args.model,
            "prompt": [rng.randrange(10, args.max_token_id) for _ in range(args.prompt_len)],
            "max_tokens": args.output_len,
            "min_tokens": args.output_len,
            "ignore_eos": True,
            "stream": True,
        }
        drop = rng.randrange(1, args.output_len) if rng.random() < args.drop_share else None
        try:
            n = await _stream(client, body, drop)
        except httpx.TransportError:  # e.g. a kept-alive connection the server had closed
            tally["transport_errors"] += 1
            continue
        tally["dropped" if n < 0 else "completed"] += 1
        tally["tokens"] += abs(n)


def gauges(url: str) -> dict[str, float]:
    """The server's running, waiting and KV-usage gauges from ``/metrics``."""
    return parse_gauges(httpx.get(f"{url}/metrics", timeout=10).text)


def parse_gauges(text: str) -> dict[str, float]:
    """Those gauges from a Prometheus text page (NaN where one is missing)."""
    out = {}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        m = re.search(rf"^vllm:{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


async def _run(args) -> dict:
    """One client (one connection) per stream: ``bench_client.one_connection_clients``."""
    tally = {"completed": 0, "dropped": 0, "tokens": 0, "transport_errors": 0}
    clients = one_connection_clients(args.url, args.streams)
    start = time.monotonic()

    async def worker(i: int, client: httpx.AsyncClient) -> None:
        async with client:
            rng = random.Random(args.seed * 100_003 + i)
            await _worker(client, args, rng, start + args.duration, tally)

    await asyncio.gather(*(worker(i, c) for i, c in enumerate(clients)))
    tally["wall_s"] = time.monotonic() - start
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m executor.serve.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="qwen2.5-7b")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--drop-share", type=float, default=0.1)
    p.add_argument("--max-token-id", type=int, default=30000, help="prompt ids drawn below this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    result = asyncio.run(_run(args))
    time.sleep(2.0)  # aborts of the last drops reach the engine
    result.update(gauges(args.url))
    result["tokens_per_s"] = result["tokens"] / result["wall_s"]
    print(json.dumps(result))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({**vars(args), **result}, f)
    idle = [
        result[k] for k in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
    ]
    return 0 if all(v == 0 for v in idle) else 1


if __name__ == "__main__":
    sys.exit(main())
