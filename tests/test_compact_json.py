"""experiments.compact_json: floats to significant digits, everything else as it was."""

from __future__ import annotations

import json

from experiments.compact_json import dumps, rounded


def test_floats_keep_their_significant_digits_and_the_rest_is_unchanged():
    obj = {"b": [1 / 3, 2, None, "x"], "a": {"t": 123456.789, "n": True}, "c": (1e-9 / 7,)}
    out = rounded(obj, 4)
    assert out == {"b": [0.3333, 2, None, "x"], "a": {"t": 123500.0, "n": True}, "c": [1.429e-10]}
    assert obj["b"][0] == 1 / 3  # the input is not modified
    text = dumps(obj, 4)
    assert text.endswith("\n") and "\n" not in text[:-1] and " " not in text
    assert json.loads(text) == out and text.index('"a"') < text.index('"b"')


def test_digits_none_keeps_every_float_and_unsorted_keeps_the_order():
    obj = {"b": 1 / 3, "a": [2 / 3, {"z": 1e-300 / 7, "y": 123456.789}]}
    text = dumps(obj, digits=None, sort_keys=False)
    assert json.loads(text) == obj and " " not in text and text.endswith("}\n")
    assert text.index('"b"') < text.index('"a"') and text.index('"z"') < text.index('"y"')
    assert json.loads(dumps(obj, digits=3, sort_keys=False)) == {
        "b": 0.333, "a": [0.667, {"z": 1.43e-301, "y": 123000.0}]
    }  # fmt: skip
    assert json.loads(dumps(obj, digits=3, exact=("a",))) == {"b": 0.333, "a": obj["a"]}
