"""The load-generator comparison's parts: GuideLLM's figures, the records' side, and the TTFT
split (a served run's trace against GuideLLM-shaped timings)."""

import asyncio
import json
import math
import time

import httpx
import numpy as np
from serve_fixtures import MODEL, served

from executor.serve.soak import parse_gauges
from experiments import serve_loadgen_split as ttft_split
from experiments.serve_loadgen_compare import client_side, guidellm_rows, records_side
from horizon.metrics.latency import ttft


def _bench() -> dict:
    req = [
        {"time_to_first_token_ms": 100.0, "inter_token_latency_ms": 20.0, "request_latency": 2.0},
        {"time_to_first_token_ms": 1500.0, "inter_token_latency_ms": 10.0, "request_latency": 3.0},
        {"time_to_first_token_ms": 50.0, "inter_token_latency_ms": None, "request_latency": 0.1},
    ]
    return {
        "config": {"strategy": {"rate": 7.0}},
        "start_time": 10.0,
        "end_time": 20.0,
        "requests": {"successful": req, "errored": [{}], "incomplete": []},
    }


def test_client_side_from_guidellm_requests():
    rows = guidellm_rows(_bench())
    assert rows["rate"] == 7.0 and rows["errored"] == 1 and rows["incomplete"] == 0
    s = client_side(rows)
    assert s["requests"] == 3
    assert np.isclose(s["ttft_p50"], 0.1) and np.isclose(s["itl_mean"], 0.015)
    assert np.isclose(s["goodput_mean_itl"], 2 / 3)  # the 1.5 s TTFT misses; one token passes


def test_every_gap_goodput_is_stricter_than_mean_itl():
    r = {
        "ttft": np.array([0.1, 0.2, 0.3]),
        "itl_mean": np.array([0.01, 0.02, 0.03]),
        "itl_max": np.array([0.02, 0.08, 0.04]),  # the second request has one 80 ms gap
        "e2e": np.array([1.0, 2.0, 3.0]),
    }
    all3 = records_side(r, np.ones(3, bool))
    assert all3["goodput_mean_itl"] == 1.0 and np.isclose(all3["goodput_every_gap"], 2 / 3)
    assert records_side(r, np.array([True, False, False]))["goodput_every_gap"] == 1.0


def test_soak_reads_the_servers_gauges():
    text = (
        "# HELP vllm:num_requests_running x\nvllm:num_requests_running 0.0\n"
        'vllm:num_requests_waiting{model_name="m"} 3\nvllm:kv_cache_usage_perc 0.25\n'
    )
    g = parse_gauges(text)
    assert g == {
        "num_requests_running": 0.0,
        "num_requests_waiting": 3.0,
        "kv_cache_usage_perc": 0.25,
    }


async def _chat(c: httpx.AsyncClient, i: int) -> tuple[float, float, str]:
    """A streamed chat as GuideLLM times it (Unix s): start, first chunk with content, id."""
    body = {"model": MODEL, "max_tokens": 8, "ignore_eos": True, "stream": True}
    body["messages"] = [{"role": "user", "content": f"hello {i}"}]
    start, first, rid = time.time(), math.nan, ""
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and math.isnan(first):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first, rid = time.time(), chunk["id"]
    return start, first, rid


async def _chats(url: str, n: int) -> list[tuple[float, float, str]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        return await asyncio.gather(*(_chat(c, i) for i in range(n)))


def test_the_ttft_split_adds_up_to_the_clients_ttft(tmp_path):
    with served() as (server, http):
        timed = asyncio.run(_chats(http.url, 6))
        server.live.wait_idle()
    live, rec = server.live, server.live.records()
    zero = time.time() - (time.perf_counter() - live.clock_start)  # as executor.serve saves it
    server.hub.trace.save_npz(str(tmp_path / ttft_split.TRACE), live.clock_start)
    successful = [
        {"response_id": i, "info": {"timings": {"request_start": s, "first_token_iteration": f}}}
        for s, f, i in timed
    ]
    docs = [{"benchmarks": [{"requests": {"successful": successful}}]}]
    cols = ttft_split.columns(tmp_path, rec, docs, zero)
    assert set(cols) == {*ttft_split.SERVER, *ttft_split.CLIENT}
    sel = ~np.isnan(cols["in_send"])
    assert sel.sum() == len(timed) and np.all(cols["out_read"][sel] > 0)
    client_ttft = float(np.mean([f - s for s, f, _ in timed]))
    m = ttft_split.means({**cols, "ttft": ttft(rec)}, sel, client_ttft)
    assert m["matched"] == len(timed)
    assert abs(m["left"]) < 0.05  # ms: the parts add up to the client's TTFT
    table = ttft_split.table([{"rate": 5.0, "client": {"ttft_mean": client_ttft}, "split": m}])
    assert "| 5 |" in table and "TTFT split" in table
    assert ttft_split.columns(tmp_path / "none", rec, docs, zero) == {}  # no trace, no split
