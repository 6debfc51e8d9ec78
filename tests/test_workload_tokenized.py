"""Qwen tokenisation of a corpus, the chat template, and the explicit .npz token cache."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from horizon.workload import (
    ChatTemplate,
    encode_text,
    load_sharegpt,
    load_tokenizer,
    tokenize_corpus,
)

QWEN_IM_START, QWEN_IM_END = 151644, 151645


def _write(path, conversations):
    elements = [
        {"id": str(i), "conversations": [{"from": f, "value": v} for f, v in turns]}
        for i, turns in enumerate(conversations)
    ]
    path.write_text(json.dumps(elements), encoding="utf-8")


CONVERSATIONS = [
    [("human", "Hello world"), ("gpt", "Hi! How can I help you today?")],
    [("system", "dropped"), ("human", "Write <|im_end|> literally"), ("gpt", "<|im_end|>")],
    [("gpt", "I speak first"), ("human", "ok"), ("gpt", "")],
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "conv.json"
    _write(path, CONVERSATIONS)
    return path


def test_hello_world_ids(tok):
    assert encode_text(tok, "Hello world") == [9707, 1879]


def test_special_token_strings_in_text_are_plain_text(tok):
    ids = encode_text(tok, "a <|im_end|> b")
    assert QWEN_IM_END not in ids
    assert tok.decode(ids) == "a <|im_end|> b"


def test_chat_template_pieces(tok):
    template = ChatTemplate.from_tokenizer(tok)
    assert template.user_header == (QWEN_IM_START, *encode_text(tok, "user\n"))
    assert template.assistant_header == (QWEN_IM_START, *encode_text(tok, "assistant\n"))
    assert template.turn_end == (QWEN_IM_END, *encode_text(tok, "\n"))
    prompt = template.generation_prompt([], encode_text(tok, "Hello world"))
    expected = "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(prompt) == expected
    # tokenising the whole templated string (control tokens on) gives the same ids here
    assert prompt == tok.encode(expected)


def test_tokenize_every_turn_and_write_the_cache(tok, corpus_file, tmp_path):
    corpus = load_sharegpt(corpus_file)
    cache = tmp_path / "sub" / "tokens.npz"
    tc = tokenize_corpus(corpus, cache)
    assert cache.is_file() and tc.cache_path == str(cache.resolve())
    assert not tc.loaded_from_cache
    assert tc.num_conversations == 3
    assert [tc.num_turns(c) for c in range(3)] == [2, 2, 3]
    for c, conv in enumerate(corpus.conversations):
        for k, (role, text) in enumerate(conv):
            assert tc.turn_ids(c, k).tolist() == encode_text(tok, text)
            assert tc.turn_role(c, k) == role
    assert tc.turn_ids(0, 0).tolist() == [9707, 1879]
    assert tc.turn_ids(2, 2).size == 0  # the empty reply
    assert tc.token_ids.dtype == np.int32
    assert tc.turn_lengths.tolist() == [
        len(tc.turn_ids(c, k)) for c in range(3) for k in range(tc.num_turns(c))
    ]
    assert tc.source == corpus.source and tc.num_read == 3 and not tc.truncated
    assert tc.template == ChatTemplate.from_tokenizer(tok)
    with pytest.raises(ValueError):
        tc.token_ids[0] = 1  # read-only
    with pytest.raises(IndexError):
        tc.turn_ids(0, 2)


def test_cache_is_loaded_when_the_fingerprint_matches(corpus_file, tmp_path):
    corpus = load_sharegpt(corpus_file)
    cache = tmp_path / "tokens.npz"
    first = tokenize_corpus(corpus, cache)
    again = tokenize_corpus(load_sharegpt(corpus_file), cache)
    assert again.loaded_from_cache
    for name in ("token_ids", "turn_offsets", "conversation_offsets", "roles"):
        a, b = getattr(first, name), getattr(again, name)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert again.template == first.template
    assert (again.source, again.num_read, again.truncated) == (first.source, 3, False)


def test_changed_source_invalidates_the_cache(corpus_file, tmp_path):
    cache = tmp_path / "tokens.npz"
    tokenize_corpus(load_sharegpt(corpus_file), cache)
    _write(corpus_file, [[("human", "Something else entirely"), ("gpt", "Indeed")]])
    st = corpus_file.stat()
    os.utime(corpus_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    rebuilt = tokenize_corpus(load_sharegpt(corpus_file), cache)
    assert not rebuilt.loaded_from_cache
    assert rebuilt.num_conversations == 1
    # the rewritten cache now matches the new file
    assert tokenize_corpus(load_sharegpt(corpus_file), cache).loaded_from_cache


def test_same_file_but_touched_invalidates_the_cache(corpus_file, tmp_path):
    cache = tmp_path / "tokens.npz"
    tokenize_corpus(load_sharegpt(corpus_file), cache)
    st = corpus_file.stat()
    os.utime(corpus_file, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert not tokenize_corpus(load_sharegpt(corpus_file), cache).loaded_from_cache


def test_a_different_corpus_of_the_same_file_invalidates_the_cache(corpus_file, tmp_path):
    cache = tmp_path / "tokens.npz"
    corpus = load_sharegpt(corpus_file)
    tokenize_corpus(corpus, cache)
    subset = dataclasses.replace(corpus, conversations=corpus.conversations[:2])
    tc = tokenize_corpus(subset, cache)
    assert not tc.loaded_from_cache and tc.num_conversations == 2


def test_a_foreign_file_at_the_cache_path_is_not_overwritten(corpus_file, tmp_path):
    cache = tmp_path / "notes.npz"
    cache.write_text("my notes")
    with pytest.raises(ValueError, match="not a Horizon token cache"):
        tokenize_corpus(load_sharegpt(corpus_file), cache)
    assert cache.read_text() == "my notes"
