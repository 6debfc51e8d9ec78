"""The TTFT gap between a client and the server's records, split, on this machine: the tiny
random-weight model served by ``python -m executor.serve`` (the engine in its own process, as
on the GPU), driven by ``executor.serve.bench_client`` (closed-loop streams, one connection
each, in a process of its own) at a few concurrency levels, or by Poisson arrivals at a few
rates (``--rates``; not a test; figures are noisy).

    python -m experiments.serve_loadgen_cpu --concurrency 1,16,64 --requests 400
    python -m experiments.serve_loadgen_cpu --trees .,/tmp/old --repeat 3   # A/B, alternating

Per level and tree: the client's TTFT (request sent to its first token's chunk read), the
records' (receipt to the engine's first token), the way out the server stamps
(``executor.serve.ttft_trace``: pipe, text, loop, write) and the way in, what is left:
client = records + way out + way in. A tree without the trace (older code) gives the first
two only. ``--trees``: the server runs from each (a ``git worktree`` of older code), in turn,
``--repeat`` times (``TREE@OPTIONS``: with more options, e.g. ``.@--loop uvloop``); the client
and this driver always from this one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

PARTS = ("out_pipe", "out_text", "out_loop", "out_write")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.serve_loadgen_cpu")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated stream counts")
    p.add_argument(
        "--rates",
        default="",
        help="comma-separated Poisson rates (req/s; open loop, at most the largest "
        "concurrency at once) instead of closed-loop levels",
    )
    p.add_argument("--requests", type=int, default=400, help="requests per level")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt characters (bytes)")
    p.add_argument("--output-len", type=int, default=32, help="forced output tokens")
    p.add_argument(
        "--trees",
        default=".",
        help="comma-separated source trees of the server, each TREE or TREE@OPTIONS (more "
        "options of executor.serve for that one)",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds over the trees")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--server-args", default="", help="more options of executor.serve")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def server_cmd(args: argparse.Namespace, records: Path, c: int) -> list[str]:
    blocks = c * (-(-(args.prompt_len + args.output_len) // 16) + 1) + 64
    return [
        sys.executable, "-m", "executor.serve", "--model", "tiny", "--device", "cpu",
        "--engine", "process", "--num-blocks", str(blocks), "--max-num-seqs", str(max(c, 1)),
        "--no-prefix-caching", "--port", str(args.port), "--records", str(records),
        "--max-waiting", str(args.requests + 16), "--torch-threads", "1",
        *args.server_args.split(),
    ]  # fmt: skip


def _wait_up(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not come up")


def bodies(args: argparse.Namespace, n: int, seed: int) -> list[dict]:
    """``n`` streamed completions of random lowercase prompts, forced lengths."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    out = args.output_len
    body = {"model": "tiny", "max_tokens": out, "min_tokens": out, "ignore_eos": True}
    body.update(temperature=0, stream=True)
    return [
        {**body, "prompt": rng.choice(letters, args.prompt_len).tobytes().decode()}
        for _ in range(n)
    ]


def run_level(args: argparse.Namespace, tree: str, c: int, rate: float, seed: int) -> dict:
    """One server from ``tree`` (its engine warmed up) serving ``args.requests`` requests
    through ``c`` streams (``rate`` > 0: Poisson arrivals of that rate, at most ``c`` at once);
    ``summary`` of what the client and the server saw."""
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records.npz"
        tree, _, extra = tree.partition("@")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        cmd = server_cmd(args, records, c) + extra.split()
        log = open(Path(tmp) / "server.log", "w+")  # noqa: SIM115 (read back below)
        server = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_up(args.port, server)
            job = {"url": f"http://127.0.0.1:{args.port}", "concurrency": c}
            job.update(rate=rate, seed=seed)
            job["bodies"] = bodies(args, args.requests, seed)
            cpu = _cpu_s(server.pid)
            client = subprocess.run(
                [sys.executable, "-m", "executor.serve.bench_client"],
                input=json.dumps(job), capture_output=True, text=True, check=True,
            )  # fmt: skip
            cpu = _cpu_s(server.pid) - cpu
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=120)
            log.seek(0)
            err = log.read()
            log.close()
        if server.returncode:
            raise RuntimeError(f"the server failed ({server.returncode}):\n{err[-2000:]}")
        out = summary(json.loads(client.stdout), records)
        out["server_cpu_us_per_token"] = 1e6 * cpu / (args.requests * args.output_len)
        return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (its threads, not its
    children: the HTTP server's, without its engine's process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(client: dict, records: Path) -> dict:
    """Means (ms) of the client's TTFT, the records', and where the trace is there the way
    out's parts and the way in's (``in_send``, ``in_body``; the client's read, ``out_read``,
    counted with the way in: client = records + way out + way in)."""
    from horizon.metrics.latency import ttft
    from horizon.metrics.records import RunRecords

    rec = RunRecords.load_npz(str(records))
    timings = client["timings"]
    sent = np.array([t["sent"] for t in timings])
    read = np.array([t["token_times"][0] for t in timings])
    client_ttft = read - sent
    server_ttft = ttft(rec)
    out = {
        "requests": len(timings),
        "client_ttft": 1e3 * float(client_ttft.mean()),
        "client_ttft_p50": 1e3 * float(np.median(client_ttft)),
        "server_ttft": 1e3 * float(np.nanmean(server_ttft)),
        "server_ttft_p50": 1e3 * float(np.nanmedian(server_ttft)),
        "transport_errors": len(client["transport_errors"]),
    }
    trace_path = records.with_name(records.stem + ".ttft.npz")
    if not trace_path.exists():
        return out
    from executor.serve.ttft_trace import client_split, load_npz, split

    trace = load_npz(str(trace_path))
    parts = split(trace, rec)
    for k in (*PARTS, "ttft_out", "in_body"):
        out[k] = 1e3 * float(np.nanmean(parts[k]))
    out["way_in"] = out["client_ttft"] - out["server_ttft"] - out["ttft_out"]
    zero = json.loads(records.with_suffix(".json").read_text())["clock_zero_perf_s"]
    ids = np.array([t["response_id"] for t in timings], dtype=str)
    ends = client_split(trace, ids, sent - zero, read - zero, first_is_text=False)
    for k, v in ends.items():
        out[k] = 1e3 * float(np.nanmean(v))
    out["matched"] = int(np.sum(~np.isnan(ends["in_send"])))
    return out


def table(rows: list[dict]) -> str:
    head = (
        f"{'tree':>14} {'level':>7} {'client':>7} {'records':>7} {'gap':>6} {'out':>6} "
        f"{'pipe':>6} {'text':>6} {'loop':>6} {'write':>6} {'in':>6} {'send':>6} {'body':>6} "
        f"{'read':>6} {'cpu/tok':>7}   (TTFT means, ms; server CPU us per token)"
    )
    lines = [head]
    for r in rows:
        s = r["summary"]
        gap = s["client_ttft"] - s["server_ttft"]
        split = " ".join(
            f"{s[k]:>6.2f}" if k in s else f"{'-':>6}"
            for k in ("ttft_out", *PARTS, "way_in", "in_send", "in_body", "out_read")
        )
        lines.append(
            f"{_name(r['tree']):>14} {r['concurrency']:>7} "
            f"{s['client_ttft']:>7.2f} {s['server_ttft']:>7.2f} {gap:>6.2f} {split} "
            f"{s['server_cpu_us_per_token']:>7.1f}"
        )
    return "\n".join(lines)


def medians(rows: list[dict]) -> list[dict]:
    """Per tree and level, every figure's median over the rounds (rows as ``table`` takes)."""
    keys = sorted({(r["tree"], r["concurrency"]) for r in rows}, key=lambda k: (k[1], k[0]))
    out = []
    for tree, c in keys:
        sel = [r["summary"] for r in rows if (r["tree"], r["concurrency"]) == (tree, c)]
        names = [k for k in sel[0] if all(k in s for s in sel)]
        med = {k: statistics.median(s[k] for s in sel) for k in names}
        out.append({"tree": tree, "concurrency": c, "rounds": len(sel), "summary": med})
    return out


def _name(tree: str) -> str:
    path, _, extra = tree.partition("@")
    return ((Path(path).name or path) + " " + extra.replace("--", "")).strip()[-14:]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    rates = [float(r) for r in args.rates.split(",") if r]
    runs = [(max(levels), r) for r in rates] or [(c, 0.0) for c in levels]
    trees = [t for t in args.trees.split(",") if t]
    rows = []
    for k in range(args.repeat):
        for c, rate in runs:
            for tree in trees if k % 2 == 0 else trees[::-1]:
                s = run_level(args, tree, c, rate, seed=k)
                level = rate or c
                rows.append({"tree": tree, "concurrency": level, "round": k, "summary": s})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.repeat > 1:
        print(f"medians of {args.repeat} rounds:")
        print(table(medians(rows)))
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
