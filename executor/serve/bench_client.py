"""The benchmark's HTTP client (imports only httpx): ``concurrency`` closed-loop workers (or
an open loop of Poisson arrivals) stream completions and time every token.
``executor.serve.bench`` runs it as its own process (``python -m executor.serve.bench_client``:
a JSON job on stdin, the result on stdout), so that its CPU time does not share the server's
interpreter."""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import sys
import time
from dataclasses import asdict, dataclass

import httpx


@dataclass
class Timing:
    """One request as the client saw it (perf_counter seconds)."""

    sent: float
    token_times: list[float]
    num_tokens: int  # from the usage chunk
    finish_reason: str | None
    response_id: str = ""  # its chunks' id (the server's trace names it)


async def _one(client: httpx.AsyncClient, body: dict) -> Timing:
    sent = time.perf_counter()
    times: list[float] = []
    tokens, finish, rid = 0, None, ""
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", ()):
                times.append(time.perf_counter())
                finish = c.get("finish_reason") or finish
            rid = rid or chunk.get("id", "")
    return Timing(sent, times, tokens, finish, rid)


async def _one_or_retry(client: httpx.AsyncClient, body: dict, errors: list[str]) -> Timing:
    """``_one``, sent again (once) when its connection fails (e.g. a reused keep-alive
    connection closed under it); each failure is counted, a failed attempt's tokens are not."""
    try:
        return await _one(client, body)
    except httpx.TransportError as e:
        errors.append(f"{type(e).__name__}: {e}")
        return await _one(client, body)


def one_connection_clients(url: str, n: int, timeout: float = 600) -> list[httpx.AsyncClient]:
    """``n`` clients of one connection each, sharing one TLS context (see ``_run``)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tls = ssl.create_default_context()
    kw = {"base_url": url, "limits": limits, "timeout": timeout, "verify": tls}
    return [httpx.AsyncClient(**kw) for _ in range(n)]


async def _run(
    url: str, bodies: list[dict], concurrency: int
) -> tuple[float, float, list[Timing], list[str]]:
    """Each worker has a client (one connection) of its own: httpcore's pool scans all its
    connections at every request and response, which at 256 connections in one pool cost the
    client more CPU than the server spent. The clients share one TLS context (building one
    reads the CA bundle: 30 ms) and are made before the clock starts."""
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    out: list[Timing] = []
    errors: list[str] = []
    clients = one_connection_clients(url, concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        async with client:
            while not queue.empty():
                out.append(await _one_or_retry(client, queue.get_nowait(), errors))

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    return start, time.perf_counter(), out, errors


async def _run_poisson(
    url: str, bodies: list[dict], concurrency: int, rate: float, seed: int
) -> tuple[float, float, list[Timing], list[str]]:
    """Open loop: ``bodies`` sent at Poisson times of ``rate`` per second (seeded), each on
    the first idle of ``concurrency`` one-connection clients (none idle: it waits for one)."""
    rng = random.Random(seed)
    clients = one_connection_clients(url, concurrency)
    idle: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for c in clients:
        idle.put_nowait(c)
    out: list[Timing] = []
    errors: list[str] = []

    async def one(body: dict) -> None:
        client = await idle.get()
        try:
            out.append(await _one_or_retry(client, body, errors))
        finally:
            idle.put_nowait(client)

    start = due = time.perf_counter()
    tasks = []
    for b in bodies:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(one(b)))
    await asyncio.gather(*tasks)
    end = time.perf_counter()
    for c in clients:
        await c.aclose()
    return start, end, out, errors


def run_load(
    url: str, bodies: list[dict], concurrency: int, rate: float = 0.0, seed: int = 0
) -> dict:
    """Serve ``bodies`` through ``concurrency`` streams (closed loop; ``rate`` > 0: sent at
    Poisson times of that many per second, at most ``concurrency`` at once); start and end
    (``perf_counter``: one clock for the machine's processes), each request's timings (plain
    dicts) and the transport errors retried."""
    if rate > 0:
        run = _run_poisson(url, bodies, concurrency, rate, seed)
    else:
        run = _run(url, bodies, concurrency)
    start, end, timings, errors = asyncio.run(run)
    return {
        "start": start,
        "end": end,
        "timings": [asdict(t) for t in timings],
        "transport_errors": errors,
    }


def main() -> None:
    """stdin: ``{"url", "bodies", "concurrency"}`` (and ``rate``, ``seed``: open loop);
    stdout: ``run_load``'s result."""
    job = json.load(sys.stdin)
    result = run_load(
        job["url"], job["bodies"], job["concurrency"], job.get("rate", 0.0), job.get("seed", 0)
    )
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
