"""The byte-level BPE tokenizer and the incremental detokenizer on a hand-made vocabulary (the
real one is tested against HF's ids in test_smollm2.py)."""

from __future__ import annotations

import pytest

from executor.detokenizer import IncrementalDetokenizer
from executor.tokenizer import Tokenizer, byte_alphabet

pytest.importorskip("regex")

A = byte_alphabet()
SPECIAL = ["<|end|>", "<|start|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ Ġ"]
MERGES.append(A[0xC3] + " " + A[0xA9])  # é


def tiny(pre: str = "smollm", **kw) -> Tokenizer:
    byte_tokens = [A[b] for b in range(256)]
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = SPECIAL + byte_tokens + merged
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    return Tokenizer(tokens, MERGES, types, pre, eos_token_ids=[0], **kw)


def test_byte_alphabet_is_gpt2s() -> None:
    assert sorted(A) == list(range(256)) and len(set(A.values())) == 256
    assert (A[ord(" ")], A[ord("\n")], A[ord("a")], A[0xAD]) == ("Ġ", "Ċ", "a", "Ń")


def test_merges_specials_and_digits() -> None:
    tok = tiny()
    ids = tok.encode("hello world<|end|>")
    assert [tok.tokens[i] for i in ids] == ["hello", "Ġworld", "<|end|>"]
    assert tok.decode(ids) == "hello world" and tok.decode(ids, skip_special=False).endswith(
        "<|end|>"
    )
    # smollm isolates each digit (so the space before it is its own piece); gpt2 does not
    assert [tok.tokens[i] for i in tok.encode("a  12")] == ["a", "ĠĠ", "1", "2"]
    gpt2 = tiny("gpt2")
    assert [gpt2.tokens[i] for i in gpt2.encode("a  12")] == ["a", "Ġ", "Ġ", "1", "2"]
    assert tok.encode("<|end") == [tok.tokens.index(A[b]) for b in b"<|end"]


def test_detokenizer_holds_back_a_split_character() -> None:
    tok = tiny()
    c3, a9 = tok.tokens.index(A[0xC3]), tok.tokens.index(A[0xA9])
    d = IncrementalDetokenizer(tok)
    assert [d.push(i) for i in (tok.encode("caf")[0], c3, a9)] == ["c", "", "é"]
    assert d.push(c3) == "" and d.flush() == "\ufffd" and d.flush() == ""
    assert d.push(0) == ""  # a special token, skipped
    assert IncrementalDetokenizer(tok, skip_special=False).push(0) == "<|end|>"
    assert tok.encode("é") == [tok.tokens.index(A[0xC3] + A[0xA9])]


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unsupported tokenizer.ggml.pre 'llama-bpe'"):
        tiny("llama-bpe")
    with pytest.raises(ValueError, match="lacks field 'tokenizer.chat_template'"):
        tiny().apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny().decode([10**6])
    with pytest.raises(ValueError, match="tokenizer.ggml.model 'llama'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})


def test_chat_template_renders_like_hf() -> None:
    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tok = tiny(chat_template=template)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "<user>hi<|end|>\n<assistant>"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "<user>hi<|end|>\n"
