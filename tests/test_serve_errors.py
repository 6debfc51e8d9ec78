"""Bad requests are answered as OpenAI's API answers them: status 400 (404 for an unknown
model) and ``{"error": {"message", "type", "param", "code"}}`` naming the field; the engine's
integrity holds after every case."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_fixtures import MAX_MODEL_LEN, MODEL, served, settle

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    with served() as s:
        yield s


@pytest.fixture(autouse=True)
def integrity(server):
    yield
    settle(server[0])


def post(server, path: str, body=None, content: bytes | None = None) -> httpx.Response:
    url = server[1].url + path
    if content is not None:
        return httpx.post(url, content=content, headers={"content-type": "application/json"})
    return httpx.post(url, json=body)


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": "a",}', b"\xff\xfe"])
def test_malformed_json(server, raw):
    err = error_of(post(server, "/v1/completions", content=raw))
    assert err["type"] == "invalid_request_error" and err["param"] is None
    assert "JSON" in err["message"]


def test_body_not_an_object(server):
    assert "object" in error_of(post(server, "/v1/completions", [1, 2]))["message"]


COMPLETION_CASES = [
    ({"max_tokens": 4}, "prompt", "missing_required_parameter"),
    ({"prompt": 5}, "prompt", "invalid_type"),
    ({"prompt": ""}, "prompt", "invalid_value"),
    ({"prompt": []}, "prompt", "invalid_value"),
    ({"prompt": ["a", "b"]}, "prompt", "unsupported_value"),
    ({"prompt": [1, 2, 99999]}, "prompt", "invalid_value"),
    ({"prompt": "a", "max_tokens": "ten"}, "max_tokens", "invalid_type"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"prompt": "a", "max_tokens": True}, "max_tokens", "invalid_type"),
    ({"prompt": "a", "temperature": "hot"}, "temperature", "invalid_type"),
    ({"prompt": "a", "temperature": 3}, "temperature", "invalid_value"),
    ({"prompt": "a", "top_p": 0}, "top_p", "invalid_value"),
    ({"prompt": "a", "top_k": -2}, "top_k", "invalid_value"),
    ({"prompt": "a", "seed": "x"}, "seed", "invalid_type"),
    ({"prompt": "a", "stream": "yes"}, "stream", "invalid_type"),
    ({"prompt": "a", "stop": [1]}, "stop", "invalid_type"),
    ({"prompt": "a", "stop": [""]}, "stop", "invalid_value"),
    ({"prompt": "a", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "invalid_value"),
    ({"prompt": "a", "ignore_eos": 1}, "ignore_eos", "invalid_type"),
    ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options", None),
    ({"prompt": "a", "stream": True, "stream_options": 3}, "stream_options", "invalid_type"),
    ({"prompt": "a", "n": 2}, "n", "unsupported_value"),
    ({"prompt": "a", "n": "2"}, "n", "invalid_type"),
    ({"prompt": "a", "best_of": 3}, "best_of", "unsupported_value"),
    ({"prompt": "a", "logprobs": 2}, "logprobs", "unsupported_value"),
    ({"prompt": "a", "echo": True}, "echo", "unsupported_value"),
    ({"prompt": "a", "presence_penalty": 0.5}, "presence_penalty", "unsupported_value"),
    ({"prompt": "a", "model": 7}, "model", "invalid_type"),
]


@pytest.mark.parametrize("fields, param, code", COMPLETION_CASES)
def test_bad_completion_fields_are_named(server, fields, param, code):
    err = error_of(post(server, "/v1/completions", fields))
    assert err["param"] == param and err["code"] == code, err


CHAT_CASES = [
    ({}, "messages", "missing_required_parameter"),
    ({"messages": "hi"}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role", "missing_required_parameter"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [*CHAT, {"role": "user", "content": 5}]}, "messages[1].content", "invalid_type"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0]",
        "unsupported_value",
    ),
    ({"messages": CHAT, "max_completion_tokens": "x"}, "max_completion_tokens", "invalid_type"),
    ({"messages": CHAT, "logprobs": True}, "logprobs", "unsupported_value"),
    ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools", "unsupported_value"),
    (
        {"messages": CHAT, "response_format": {"type": "json_object"}},
        "response_format",
        "unsupported_value",
    ),
]


@pytest.mark.parametrize("fields, param, code", CHAT_CASES)
def test_bad_chat_fields_are_named(server, fields, param, code):
    err = error_of(post(server, "/v1/chat/completions", fields))
    assert err["param"] == param and err["code"] == code, err


def test_text_content_parts_are_accepted(server):
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
    ]
    r = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": "a" * 200, "max_tokens": 100}, "max_tokens"),  # the prompt fits, not both
        ({"prompt": "a" * (MAX_MODEL_LEN + 10)}, "prompt"),  # the prompt alone is too long
        ({"prompt": "a" * MAX_MODEL_LEN, "max_tokens": 1}, "prompt"),
    ],
)
def test_over_the_model_length(server, fields, param):
    err = error_of(post(server, "/v1/completions", fields))
    assert err["param"] == param and err["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]


def test_chat_over_the_model_length_names_messages(server):
    body = {"messages": [{"role": "user", "content": "x" * 300}]}
    err = error_of(post(server, "/v1/chat/completions", body))
    assert err["param"] == "messages" and err["code"] == "context_length_exceeded"


def test_default_max_tokens_fills_the_model_length(server):
    r = post(server, "/v1/completions", {"prompt": "a" * 250, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == MAX_MODEL_LEN - 250


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_404(server, path):
    err = error_of(post(server, path, {"model": "gpt-9", "prompt": "a", "messages": CHAT}), 404)
    assert (
        err["param"] == "model" and err["code"] == "model_not_found" and "gpt-9" in err["message"]
    )
    assert error_of(httpx.get(server[1].url + "/v1/models/gpt-9"), 404)["code"] == "model_not_found"


def test_unknown_route_and_method(server):
    error_of(httpx.get(server[1].url + "/v1/nothing"), 404)
    error_of(httpx.get(server[1].url + "/v1/completions"), 405)


def test_unknown_fields_are_ignored(server):
    r = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2, "user": "u", "foo": 1})
    assert r.status_code == 200


def test_the_openai_client_raises_its_errors(server):
    client = openai.OpenAI(base_url=server[1].url + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="a", n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=CHAT)
    assert e.value.body["code"] == "model_not_found"
