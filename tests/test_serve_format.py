"""Streamed chunks from the per-response template are the characters the dict path writes,
for completions and chats, with and without usage, over text JSON must escape."""

from __future__ import annotations

import json

import pytest

from executor.serve.openai_format import ResponseFormat, sse

TEXTS = ["", "plain", 'a "quoted" \\ back', "é\n\t", "\x00\x1f", "😀 漢字", "\x00text\x00"]


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
def test_template_chunks_equal_the_dict_chunks(chat, include_usage):
    fmt = ResponseFormat(chat, 'model "x"/é', include_usage)
    for text in TEXTS:
        for finish in (None, "stop", "length", "abort"):
            line = fmt.chunk_sse(text, finish)
            assert line == sse(fmt.chunk(text, finish))
            body = json.loads(line.removeprefix("data: "))
            (choice,) = body["choices"]
            got = choice["delta"]["content"] if chat else choice["text"]
            assert got == text and choice["finish_reason"] == finish
            assert ("usage" in body) == include_usage
