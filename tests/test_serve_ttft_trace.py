"""The first token's way out, stamped on the server (``executor.serve.ttft_trace``): for the
engine on a thread and in its own process, concurrent streamed requests (completions and chat)
each leave one row whose moments are ordered from the endpoint's start to the first chunk with
text, whose receipt is the records' arrival, and whose parts add up to the records' TTFT plus
the way out, and with the client's ends (matched by the chunks' id) to the client's TTFT; a
request answered whole leaves none."""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import numpy as np
import pytest
from serve_fixtures import MODEL, over_http, served, tiny_config_for_serving

from executor.serve.engine_child import EngineSpec
from executor.serve.events import Event, first_tokens_first
from executor.serve.server import start_process_server
from executor.serve.ttft_trace import SPLIT, STAMPS, client_split, load_npz, split
from horizon.metrics.latency import first_token_time, ttft

STREAMS = 8


async def _stream(c: httpx.AsyncClient, body: dict) -> tuple[float, float, str]:
    """One streamed completion: when it was sent, when its first token's chunk was read, and
    the chunks' id (``perf_counter``, the client's side)."""
    sent, first, rid = time.perf_counter(), math.nan, ""
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {") and math.isnan(first):
                first, rid = time.perf_counter(), json.loads(line[6:])["id"]
    return sent, first, rid


async def _load(url: str) -> list[tuple[float, float, str]]:
    """``STREAMS`` streamed completions (their client-side times), a streamed chat and a
    whole completion, all at once."""
    body = {"model": MODEL, "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        streams = [_stream(c, {**body, "prompt": f"p{i}", "stream": True}) for i in range(STREAMS)]
        chat = {**body, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        others = [
            c.post("/v1/chat/completions", json=chat),
            c.post("/v1/completions", json={**body, "prompt": "whole"}),
        ]
        *timed, chat_r, whole_r = await asyncio.gather(*streams, *others)
        assert chat_r.status_code == whole_r.status_code == 200
    return timed


def _check(server, tmp_path, timed) -> None:  # noqa: ANN001
    """``server``'s trace after the load, against its records (the engine closed) and the
    client's times."""
    live = server.live
    rec = live.records()
    path = str(tmp_path / "run.ttft.npz")
    server.hub.trace.save_npz(path, live.clock_start)
    trace = load_npz(path)
    assert set(trace) == {"request_id", "response_id", *STAMPS}
    assert len(trace["request_id"]) == STREAMS + 1  # the streamed ones, not the whole one
    parts = split(trace, rec)
    assert set(parts) == {*SPLIT, "receipt_lag"}
    traced = ~np.isnan(parts["ttft_out"])
    assert traced.sum() == STREAMS + 1 and (~traced).sum() == 1
    # the receipt is the records' arrival, or later for a request received after the loop
    # read its clock for the plan it joined (the arrival: that plan's time, a step at most)
    lag = parts["receipt_lag"][traced]
    assert np.all(lag <= 0.0) and np.all(lag > -1.0)  # a step: ms here, 1 s under any load
    # ordered: handler <= receipt <= first token <= received <= posted <= delivered <= written
    row = np.searchsorted(rec.request_id, trace["request_id"])
    first = first_token_time(rec)[row]
    chain = [trace["handler"], trace["receipt"], first, *(trace[k] for k in STAMPS[2:])]
    for a, b in zip(chain, chain[1:]):
        assert np.all(a <= b), (a, b)
    # the parts add up: the records' TTFT + the way out + the lag = written - receipt
    written = trace["written"] - trace["receipt"]
    lagged = ttft(rec)[row] + parts["ttft_out"][row] + parts["receipt_lag"][row]
    np.testing.assert_allclose(lagged, written, atol=1e-9)
    way_out = sum(parts[k][traced] for k in ("out_pipe", "out_text", "out_loop", "out_write"))
    np.testing.assert_allclose(way_out, parts["ttft_out"][traced], atol=1e-9)
    # the client's ends, matched by the chunks' id: its TTFT = send + body + records + out + read
    sent, read, ids = (np.array(x) for x in zip(*timed))
    ends = client_split(trace, ids, sent - live.clock_start, read - live.clock_start, False)
    assert np.all(ends["in_send"] > 0) and np.all(ends["out_read"] > 0)
    request_of = dict(zip(trace["response_id"], trace["request_id"]))
    at = np.searchsorted(rec.request_id, [request_of[i] for i in ids])
    total = ends["in_send"] + parts["in_body"][at] + ttft(rec)[at] + parts["ttft_out"][at]
    total += parts["receipt_lag"][at]
    np.testing.assert_allclose(total + ends["out_read"], read - sent, atol=1e-9)


def test_the_thread_engines_first_tokens_are_traced(tmp_path):
    with served() as (server, http):
        timed = asyncio.run(_load(http.url))
        server.live.wait_idle()
    _check(server, tmp_path, timed)


def test_the_engine_processs_first_tokens_are_traced(tmp_path):
    spec = EngineSpec(MODEL, tiny_config_for_serving(), torch_threads=1)
    server = start_process_server(spec, MODEL)
    with over_http(server) as http:
        timed = asyncio.run(_load(http.url))
        server.live.wait_idle()
    assert server.live.error is None
    _check(server, tmp_path, timed)


def test_a_trace_of_requests_the_records_lack_is_refused(tmp_path):
    with served() as (server, http):
        asyncio.run(_load(http.url))
        server.live.wait_idle()
    trace = server.hub.trace.columns(server.live.clock_start)
    trace["request_id"] = trace["request_id"] + 1000
    with pytest.raises(ValueError, match="request_id"):
        split(trace, server.live.records())


def test_first_tokens_go_first_and_each_request_keeps_its_order():
    def ev(rid: int, n: int, finish: str | None = None, tokens: tuple = (1,)) -> Event:
        return Event(rid, "", tokens, n, finish, 0.0)

    events = [ev(0, 5), ev(1, 1), ev(0, 6), ev(2, 1), ev(1, 2), ev(3, 0, "abort", ())]
    first, rest = first_tokens_first(events)
    assert first == [events[1], events[3]]
    assert rest == [events[0], events[2], events[4], events[5]]
    assert first_tokens_first(events[:1]) == ([], events[:1])
    assert first_tokens_first([events[1]]) == ([events[1]], [])
