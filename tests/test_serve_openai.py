"""The server driven by the ``openai`` package over real HTTP (uvicorn on localhost, the tiny
random-weight model on the CPU, the byte tokenizer): completions and chat, streamed and not,
concurrent streams, forced lengths, stop strings, seeds, aborts on disconnect, a full queue,
preemptions, an engine failure; the scheduler's, runner's and backend's integrity after every
test."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from serve_fixtures import MODEL, served, settle, stall, tiny_config_for_serving, tiny_model
from test_engine_offline import dense_greedy

from executor.serve.byte_tokenizer import ByteTokenizer
from executor.serve.live_engine import LiveEngine
from executor.serve.params import GenerationParams
from executor.serve.server import ServerThread, build_server

TOK = ByteTokenizer()
EOS = set(TOK.eos_token_ids)
PROMPT_WITH_EOS = "prompt 10"  # greedy: 9 tokens, then end-of-sequence (this seeded model)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def server(model):
    with served(model) as s:
        yield s


@pytest.fixture(autouse=True)
def integrity(server):
    yield
    settle(server[0])


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1].url + "/v1", api_key="-", max_retries=0)


def reference(model, ids: list[int], max_tokens: int) -> tuple[list[int], str]:
    """Greedy tokens (through the first end-of-sequence) and finish reason, by a plain dense
    decode."""
    out = dense_greedy(model, ids, max_tokens)
    for i, t in enumerate(out):
        if t in EOS:
            return out[: i + 1], "stop"
    return out, "length"


def greedy(client, prompt: str, max_tokens: int, stream: bool = False, **kw):
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=stream, **kw
    )


def streamed_text(chunks) -> tuple[str, str | None, object]:
    """Concatenated text, the finish reason and the usage of a completion stream."""
    text, finish, usage = [], None, None
    for ch in chunks:
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            text.append(c.text)
            finish = c.finish_reason or finish
    return "".join(text), finish, usage


@pytest.mark.parametrize("prompt", ["Hello", PROMPT_WITH_EOS])
def test_completion_equals_a_dense_greedy_decode(client, model, prompt):
    ids = TOK.encode(prompt)
    tokens, finish = reference(model, ids, 24)
    r = greedy(client, prompt, 24)
    c = r.choices[0]
    assert c.text == TOK.decode(tokens) and c.finish_reason == finish
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(tokens)
    assert r.usage.total_tokens == len(ids) + len(tokens)
    assert r.model == MODEL and r.object == "text_completion"
    if prompt == PROMPT_WITH_EOS:
        assert finish == "stop" and len(tokens) == 10


def test_stream_concatenates_to_the_whole_response(client):
    whole = greedy(client, "The cache holds", 30)
    chunks = list(
        greedy(client, "The cache holds", 30, True, stream_options={"include_usage": True})
    )
    text, finish, usage = streamed_text(chunks)
    assert text == whole.choices[0].text and finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens == 30
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].choices == [] and all(ch.usage is None for ch in chunks[:-1])
    assert len({ch.id for ch in chunks}) == 1


def test_stream_without_usage_ends_with_done(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 5, "stream": True, "temperature": 0}
    with httpx.stream("POST", server[1].url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]"
    assert all(x.startswith("data: ") for x in lines)
    assert '"usage"' not in "".join(lines)


def test_chat_completion_through_the_template(client, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"}]
    ids = TOK.encode(TOK.apply_chat_template(messages))
    tokens, finish = reference(model, ids, 20)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    m = r.choices[0].message
    assert m.role == "assistant" and m.content == TOK.decode(tokens)
    assert r.choices[0].finish_reason == finish and r.object == "chat.completion"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(tokens)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == m.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == len(tokens)
    assert chunks[0].object == "chat.completion.chunk"


def test_eight_concurrent_streams(server, model):
    prompts = [f"stream {i} says" for i in range(8)]
    expect = {p: reference(model, TOK.encode(p), 24) for p in prompts}
    client = openai.AsyncOpenAI(base_url=server[1].url + "/v1", api_key="-", max_retries=0)

    async def one(p: str):
        s = await client.completions.create(
            model=MODEL,
            prompt=p,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        return streamed_text([ch async for ch in s])

    async def all_of():
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await client.close()

    for p, (text, finish, usage) in zip(prompts, asyncio.run(all_of())):
        tokens, reason = expect[p]
        assert text == TOK.decode(tokens) and finish == reason
        assert usage.completion_tokens == len(tokens)


def test_forced_lengths_are_exact(client):
    lengths = [1, 7, 37, 64]
    for temperature in (0.0, 1.0):
        for n in lengths:
            r = client.completions.create(
                model=MODEL,
                prompt=PROMPT_WITH_EOS,
                max_tokens=n,
                temperature=temperature,
                extra_body={"ignore_eos": True, "min_tokens": n},
            )
            assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length"


def test_min_tokens_holds_off_end_of_sequence(client):
    r = greedy(client, PROMPT_WITH_EOS, 40, extra_body={"min_tokens": 15})
    assert r.usage.completion_tokens >= 15  # the end-of-sequence at token 10 did not stop it
    r = greedy(client, PROMPT_WITH_EOS, 40, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 40


def test_min_tokens_never_samples_end_of_sequence_before(model):
    """As vLLM: the end-of-sequence ids are masked until ``min_tokens`` (greedy here would
    take one at token 10); with ``ignore_eos`` nothing is masked."""
    events = []
    live = LiveEngine(model, TOK, tiny_config_for_serving(), publish=events.extend)
    live.start()
    try:
        held = live.submit(TOK.encode(PROMPT_WITH_EOS), GenerationParams(30, min_tokens=15))
        free = GenerationParams(12, min_tokens=12, ignore_eos=True)
        forced = live.submit(TOK.encode(PROMPT_WITH_EOS), free)
        live.wait_idle()
    finally:
        live.close()

    def tokens(rid: int) -> list[int]:
        return [t for e in events if e.request_id == rid for t in e.token_ids]

    assert len(tokens(held)) >= 15 and not EOS & set(tokens(held)[:15])
    assert tokens(forced)[9] in EOS  # unmasked: the greedy end-of-sequence at token 10


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(client, stream):
    whole = greedy(client, "Hello", 40).choices[0].text
    k = next(i for i in range(4, len(whole) - 2) if "\ufffd" not in whole[i : i + 2])
    stop = whole[k : k + 2]
    cut = whole[: whole.find(stop)]
    r = greedy(client, "Hello", 40, stream, stop=[stop, "never appears"])
    text, finish = (
        streamed_text(r)[:2] if stream else (r.choices[0].text, r.choices[0].finish_reason)
    )
    assert text == cut and finish == "stop" and stop not in text


def test_seeded_sampling_repeats(client):
    def sample(seed):
        r = client.completions.create(
            model=MODEL,
            prompt="Hello",
            max_tokens=16,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            extra_body={"top_k": 50, "ignore_eos": True},
        )
        return r.choices[0].text

    assert sample(5) == sample(5)
    assert len({sample(s) for s in range(4)}) > 1


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    url = server[1].url
    assert httpx.get(url + "/health").status_code == 200
    greedy(client, "Hello", 4)
    text = httpx.get(url + "/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:generation_tokens_total",
    ):
        assert f"\n{name}{{" in text, name
    count = [x for x in text.splitlines() if x.startswith("vllm:e2e_request_latency_seconds_count")]
    assert float(count[0].split()[-1]) >= 1


def _aborted(server) -> int:
    return server[0].live.call(lambda: server[0].live.sched.num_aborted).result(30)


def test_disconnected_stream_aborts_its_request(server):
    before = _aborted(server)
    body = {"model": MODEL, "prompt": "abort me", "max_tokens": 240, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", server[1].url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        stall(server[0], 0.5)  # it is still running when the connection closes
    settle(server[0])
    assert _aborted(server) == before + 1
    assert server[0].live.stats.kv_used_blocks == 0


def test_disconnected_request_aborts_while_waiting(server):
    before = _aborted(server)
    stall(server[0], 1.5)  # the client gives up at 0.3 s, the server sees it by 0.55 s
    body = {"model": MODEL, "prompt": "never served", "max_tokens": 8}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server[1].url + "/v1/completions", json=body, timeout=0.3)
    settle(server[0])
    assert _aborted(server) == before + 1


def test_a_full_queue_answers_429(model):
    with served(model, max_waiting=2) as (s, http):
        stall(s, 0.6)
        time.sleep(0.05)  # the engine thread is held
        body = {"model": MODEL, "prompt": "wait", "max_tokens": 2}

        async def three():
            async with httpx.AsyncClient(base_url=http.url, timeout=30) as c:
                first = [asyncio.create_task(c.post("/v1/completions", json=body)) for _ in "ab"]
                await asyncio.sleep(0.2)
                third = await c.post("/v1/completions", json=body)
                return [await f for f in first], third

        done, third = asyncio.run(three())
        assert [r.status_code for r in done] == [200, 200]
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        err = third.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and "waiting" in err["message"]
        settle(s)


def test_preemption_keeps_outputs_exact(model):
    """40 blocks of 4 tokens cannot hold four requests of ~10 + 60 tokens: some are preempted
    and recomputed; each output is still its dense greedy decode. The policy is named by its
    import path."""
    prompts = [f"preempt {i}" for i in range(4)]
    expect = [TOK.decode(dense_greedy(model, TOK.encode(p), 60)) for p in prompts]
    lpf = "horizon.policies.lpf:LongestPromptFirst"
    with served(model, policy=lpf, num_blocks=40, max_num_seqs=4) as (s, http):
        assert type(s.live.sched.policy).__name__ == "LongestPromptFirst"
        client = openai.AsyncOpenAI(base_url=http.url + "/v1", api_key="-", max_retries=0)

        async def one(p: str) -> str:
            r = await client.completions.create(
                model=MODEL,
                prompt=p,
                max_tokens=60,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            return r.choices[0].text

        async def all_of():
            try:
                return await asyncio.gather(*(one(p) for p in prompts))
            finally:
                await client.close()

        assert asyncio.run(all_of()) == expect
        settle(s)
        assert s.live.stats.num_preemptions > 0
        assert "vllm:num_preemptions_total" in httpx.get(http.url + "/metrics").text


def test_an_engine_failure_is_answered_and_reported(model):
    server = build_server(model, TOK, tiny_config_for_serving(), MODEL)

    def broken(plan):
        raise RuntimeError("the step failed")

    server.live.backend.execute = broken
    server.live.start()
    http = ServerThread(server.app)
    http.start()
    try:
        r = httpx.post(http.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3})
        assert r.status_code == 500 and "the step failed" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "server_error"
        assert httpx.get(http.url + "/health").status_code == 503
        r = httpx.post(http.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3})
        assert r.status_code == 503
    finally:
        http.stop()
        server.live.close()
    assert isinstance(server.live.error, RuntimeError)


def test_records_take_the_servers_receipt_as_arrival(model):
    """A request received while the engine thread is held: its records' arrival is the
    receipt (before the server was seen holding it), so its TTFT counts the 0.3 s the engine
    was held after that, the wait for its next step boundary."""
    release = threading.Event()
    with served(model) as (s, http):
        s.live.call(release.wait)  # the engine thread is held at its next boundary
        sent = time.perf_counter()
        post = threading.Thread(target=httpx.post, args=(http.url + "/v1/completions",),
                                kwargs={"json": {"prompt": "late", "max_tokens": 2}})  # fmt: skip
        post.start()
        while s.live.num_waiting == 0:
            time.sleep(0.001)
        seen = time.perf_counter()
        time.sleep(0.3)
        release.set()
        post.join()
        settle(s)
    rec = s.live.records()
    arrival = rec.arrival_time[0] + s.live.clock_start
    assert sent <= arrival <= seen  # received at once, not at the boundary 0.3 s later
    assert rec.tokens_of(0)[0] - rec.arrival_time[0] >= 0.3
