"""ShareGPT loading: element-by-element decoding of truncated files, role normalisation."""

from __future__ import annotations

import json

import pytest

from horizon.workload import sharegpt
from horizon.workload.sharegpt import load_sharegpt


def _element(i: int, turns: list[tuple[str, str]]) -> dict:
    return {"id": f"conv{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


def _dump(elements: list[dict]) -> str:
    return json.dumps(elements, indent=2, ensure_ascii=False)


THREE = [
    _element(0, [("human", "Hello there"), ("gpt", "Hi! How can I help?")]),
    _element(1, [("human", "héllo — 你好"), ("gpt", "ça va 🙂"), ("human", "more"), ("gpt", "ok")]),
    _element(2, [("human", "Third"), ("gpt", "reply")]),
]


@pytest.fixture(scope="module")
def packaged():
    return load_sharegpt()


def test_complete_file_reads_every_element(tmp_path):
    path = tmp_path / "full.json"
    path.write_text(_dump(THREE) + "\n\n", encoding="utf-8")
    corpus = load_sharegpt(path)
    assert corpus.num_read == 3 and not corpus.truncated
    assert corpus.conversation_ids == ("conv0", "conv1", "conv2")
    assert corpus.conversations[1][0] == ("user", "héllo — 你好")
    assert corpus.conversations[1][1] == ("assistant", "ça va 🙂")
    assert corpus.num_turns == 8
    assert corpus.source == str(path.resolve())
    assert corpus.source_size == path.stat().st_size


def test_truncated_mid_string_keeps_complete_elements(tmp_path):
    text = _dump([*THREE, _element(3, [("human", "this one is cut"), ("gpt", "x" * 50)])])
    cut = text.index("x" * 50) + 10  # inside the fourth element's reply
    path = tmp_path / "cut.json"
    path.write_text(text[:cut], encoding="utf-8")
    corpus = load_sharegpt(path)
    assert corpus.truncated
    assert corpus.num_read == 3
    assert [c[0][1] for c in corpus.conversations] == ["Hello there", "héllo — 你好", "Third"]


@pytest.mark.parametrize("tail", ["", ",", ",\n  ", ",\n  {", ',\n  {"id": "conv3", "conv'])
def test_truncated_between_or_at_start_of_element(tmp_path, tail):
    text = _dump(THREE)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex("}") + 1] + tail, encoding="utf-8")  # no closing "]"
    corpus = load_sharegpt(path)
    assert corpus.truncated and corpus.num_read == 3


def test_truncated_inside_a_multibyte_character(tmp_path):
    text = _dump([*THREE, _element(3, [("human", "你好你好你好"), ("gpt", "ok")])])
    data = text.encode("utf-8")
    cut = data.index("你好你好你好".encode()) + 4  # the middle of the second character
    path = tmp_path / "cut.json"
    path.write_bytes(data[:cut])
    corpus = load_sharegpt(path)
    assert corpus.truncated and corpus.num_read == 3


def test_small_read_chunks_give_the_same_corpus(tmp_path, monkeypatch):
    path = tmp_path / "full.json"
    path.write_text(_dump(THREE), encoding="utf-8")
    expected = load_sharegpt(path)
    monkeypatch.setattr(sharegpt, "_CHUNK_BYTES", 5)  # splits elements and UTF-8 characters
    small = load_sharegpt(path)
    assert small.conversations == expected.conversations and not small.truncated


def test_roles_are_normalised_and_others_dropped(tmp_path):
    turns = [
        ("system", "be nice"),
        ("human", "a"),
        ("gpt", "b"),
        ("user", "c"),
        ("chatgpt", "d"),
        ("Human", "e"),
        ("bard", "f"),
        ("user", "g"),
        ("bing", "h"),
        ("user", "i"),
        ("assistant", "j"),
        ("narrator", "k"),
    ]
    path = tmp_path / "roles.json"
    path.write_text(_dump([_element(0, turns)]), encoding="utf-8")
    corpus = load_sharegpt(path)
    assert corpus.num_dropped_turns == 2
    assert corpus.conversations[0] == tuple(
        ("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate("abcdefghij")
    )


def test_malformed_element_before_the_tail_raises(tmp_path):
    text = _dump(THREE)
    bad = text.replace('"Third"', '"Third" oops', 1)
    path = tmp_path / "bad.json"
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(ValueError, match="element 2"):
        load_sharegpt(path)


def test_element_without_conversations_raises(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"id": "x", "items": []}]), encoding="utf-8")
    with pytest.raises(ValueError, match="element 0 has no 'conversations'"):
        load_sharegpt(path)


def test_not_an_array_raises(tmp_path):
    path = tmp_path / "obj.json"
    path.write_text('{"conversations": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON array"):
        load_sharegpt(path)


def test_packaged_file_is_truncated_with_17671_conversations(packaged):
    assert packaged.num_read == 17_671 == len(packaged.conversations)
    assert packaged.truncated
    assert packaged.source.endswith("ShareGPT_V3_unfiltered_cleaned_split.json")
    # 129,071 turns in the file, 41 of them "system"
    assert packaged.num_dropped_turns == 41
    assert packaged.num_turns == 129_071 - 41
    assert packaged.conversations[0][0][0] == "user"
    assert packaged.conversations[0][0][1].startswith("Summarize the main ideas of Jeff Walker")
    roles = {role for conv in packaged.conversations for role, _ in conv}
    assert roles == {"user", "assistant"}
