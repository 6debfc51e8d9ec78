"""The server with its engine in a process of its own (``EngineProcess``), over real HTTP: the
same greedy tokens as a dense decode of the same weights, concurrent forced-length streams, an
abort, gauges back to zero, the run's records returned at close, and the
errors a user can cause (a policy the process cannot build, a closed engine)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from serve_fixtures import MODEL, over_http, settle, tiny_config_for_serving
from test_engine_offline import dense_greedy

from executor.serve.byte_tokenizer import ByteTokenizer
from executor.serve.engine_child import EngineSpec
from executor.serve.live_engine import EngineUnavailable
from executor.serve.model_loading import load_model
from executor.serve.params import GenerationParams
from executor.serve.server import start_process_server
from horizon.metrics.records import STATUS_FINISHED

TOK = ByteTokenizer()


def spec(**kw) -> EngineSpec:
    return EngineSpec(MODEL, tiny_config_for_serving(), torch_threads=1, **kw)


@pytest.fixture(scope="module")
def served():
    server = start_process_server(spec(), MODEL)
    with over_http(server) as http:
        yield server, http
    assert server.live.error is None


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="-", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_a_dense_greedy_decode(served, client, stream):
    model, _ = load_model(MODEL, None, "cpu")  # the engine process's weights (same seed)
    expect = TOK.decode(dense_greedy(model, TOK.encode("Hello"), 12))
    r = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=12,
        temperature=0,
        stream=stream,
        extra_body={"ignore_eos": True},
    )
    text = "".join(c.text for ch in r for c in ch.choices) if stream else r.choices[0].text
    assert text == expect
    settle(served[0])


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text_made_in_the_server(served, client, stream):
    """The engine process sends tokens only; the server makes the text, cuts it at a stop
    string and stops the request in the engine, which finishes it (not aborted) and frees its
    blocks."""
    model, _ = load_model(MODEL, None, "cpu")
    whole = TOK.decode(dense_greedy(model, TOK.encode("Hello"), 40))
    k = next(i for i in range(4, len(whole) - 2) if "\ufffd" not in whole[i : i + 2])
    stop = whole[k : k + 2]
    live, before = served[0].live, served[0].live.stats.num_aborted
    r = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=40, temperature=0, stream=stream,
        stop=[stop, "never appears"], extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(r) if stream else [r]
    text = "".join(c.text for ch in chunks for c in ch.choices)
    finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
    assert text == whole[: whole.find(stop)] and finish == ["stop"]
    settle(served[0])
    assert live.stats.num_aborted == before and live.stats.kv_used_blocks == 0
    assert len(live._texts) == 0  # nothing held for it on the server's side


def test_concurrent_streams_finish_and_free_every_block(served):
    client = openai.AsyncOpenAI(base_url=served[1].url + "/v1", api_key="-", max_retries=0)

    async def one(i: int) -> int:
        extra = {"ignore_eos": True, "min_tokens": 20}
        s = await client.completions.create(
            model=MODEL,
            prompt=f"stream {i}",
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        usage = [ch.usage async for ch in s if ch.usage is not None]
        return usage[0].completion_tokens

    async def all_of() -> list[int]:
        try:
            return await asyncio.gather(*(one(i) for i in range(12)))
        finally:
            await client.close()

    assert asyncio.run(all_of()) == [20] * 12
    server = served[0]
    settle(server)
    assert server.live.stats.kv_used_blocks == 0 and server.live.num_waiting == 0
    gauges = httpx.get(served[1].url + "/metrics").text
    assert f'vllm:num_requests_running{{model_name="{MODEL}"}} 0' in gauges


def test_an_abort_reaches_the_engine(served):
    """Submit and abort go down one pipe in order: the engine takes both at one boundary and
    the request ends aborted (the HTTP disconnect path above it is the thread engine's)."""
    live = served[0].live
    before = live.stats.num_aborted
    rid = live.submit(TOK.encode("abort me"), GenerationParams(max_tokens=200, ignore_eos=True))
    live.abort(rid)
    settle(served[0])
    assert live.stats.num_aborted == before + 1 and live.stats.kv_used_blocks == 0


def test_close_returns_the_records_and_refuses_new_requests():
    server = start_process_server(spec(), MODEL)
    live = server.live
    model, _ = load_model(MODEL, None, "cpu")
    whole = TOK.decode(dense_greedy(model, TOK.encode("Hello"), 40))
    k = next(i for i in range(4, len(whole) - 2) if "\ufffd" not in whole[i : i + 2])
    stop = {"prompt": "Hello", "max_tokens": 240, "temperature": 0, "ignore_eos": True,
            "stop": [whole[k : k + 2]]}  # fmt: skip
    with over_http(server) as http:
        r = httpx.post(http.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 5})
        assert r.status_code == 200
        r = httpx.post(http.url + "/v1/completions", json=stop)
        assert r.json()["choices"][0]["finish_reason"] == "stop", r.text
    records = live.records()
    assert records.num_requests == 2 and int(records.num_output_tokens[0]) <= 5
    # the stop string ended the request in the engine too (finished, far short of max_tokens)
    assert k + 2 <= int(records.num_output_tokens[1]) < 240
    assert (records.status == STATUS_FINISHED).all()
    assert not live.alive
    with pytest.raises(EngineUnavailable, match="closed"):
        live.submit([1, 2], GenerationParams(max_tokens=2))


def test_a_policy_the_process_cannot_build_is_reported():
    with pytest.raises(RuntimeError, match="no_such_module"):
        start_process_server(spec(policy="no_such_module:Policy"), MODEL)


def test_a_short_soak_ends_with_every_block_free(served, tmp_path):
    """``executor.serve.soak`` for 2 s: 4 streams, a third of them dropped mid-stream; the
    server's gauges are zero afterwards (its exit status says so)."""
    from executor.serve import soak

    out = tmp_path / "soak.json"
    argv = f"--url {served[1].url} --model {MODEL} --streams 4 --duration 2 --prompt-len 8"
    argv += f" --output-len 16 --drop-share 0.33 --max-token-id 500 --json-out {out}"
    assert soak.main(argv.split()) == 0
    result = json.loads(out.read_text())
    assert result["completed"] > 0 and result["dropped"] > 0 and result["transport_errors"] == 0
    settle(served[0])
    assert served[0].live.stats.kv_used_blocks == 0


def test_an_engine_process_that_dies_is_reported_and_closes():
    server = start_process_server(spec(), MODEL)
    live = server.live
    live._proc.kill()  # the engine process dies under the server
    live._proc.join(10)
    assert not live.alive
    with pytest.raises(EngineUnavailable):
        live.submit([1, 2], GenerationParams(max_tokens=2))
    live.close(timeout=5)  # returns: nothing comes back
    with pytest.raises(RuntimeError, match="no records"):
        live.records()
