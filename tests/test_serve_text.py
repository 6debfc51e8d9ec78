"""The server's text pieces without HTTP: the byte tokenizer, incremental detokenization of
multi-byte characters, stop strings held back and cut, each request's stopping rule, and the
metrics' exposition format."""

from __future__ import annotations

import random

import pytest

from executor.serve.byte_tokenizer import ByteTokenizer
from executor.serve.events import Event
from executor.serve.generation import Generation
from executor.serve.live_engine import Stats
from executor.serve.metrics import ServingMetrics
from executor.serve.params import GenerationParams
from executor.serve.request_text import RequestText, ServerTexts
from executor.serve.stop_strings import StopStrings
from executor.serve.text_stream import IncrementalText, make_detokenizer

TOK = ByteTokenizer()
TEXT = "héllo, wörld: € 😀 日本語!"


def deltas(ids, tok=TOK) -> list[str]:
    d = IncrementalText(tok)
    out = [d.push(i) for i in ids]
    return [*out, d.flush()]


def test_byte_tokenizer_round_trips_and_spans_characters():
    ids = TOK.encode(TEXT)
    assert len(ids) == len(TEXT.encode()) > len(TEXT)  # multi-byte characters span tokens
    assert TOK.decode(ids) == TEXT
    chat = TOK.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = TOK.encode(chat)
    assert ids[0] == 257 and 258 in ids and TOK.decode(ids) == "user\nhi\nassistant\n"
    assert TOK.decode(ids, skip_special=False) == chat
    assert TOK.decode([300, 104, 105]) == "hi"


def test_multibyte_characters_are_never_split():
    out = deltas(TOK.encode(TEXT))
    assert "".join(out) == TEXT
    assert all("\ufffd" not in d for d in out)
    # the tokens inside a character add no text; the one that completes it adds all of it
    assert out[:2] == ["h", ""] and out[2] == "é"


def test_random_bytes_concatenate_to_the_whole_decode():
    rng = random.Random(3)
    for _ in range(50):
        ids = [rng.choice([rng.randrange(512), *TOK.encode("é€😀")]) for _ in range(30)]
        assert "".join(deltas(ids)) == TOK.decode(ids)


def test_make_detokenizer_falls_back_for_other_tokenizers():
    assert isinstance(make_detokenizer(TOK), IncrementalText)


def test_stop_strings_hold_back_and_cut():
    s = StopStrings(["STOP", "é!"])
    assert s.feed("abc S") == ("abc ", False)  # "S" may begin "STOP"
    assert s.feed("T") == ("", False)
    assert s.feed("x") == ("STx", False)  # it did not
    assert s.feed("yyST") == ("yy", False)
    assert s.feed("OP and more") == ("", True)
    s = StopStrings(["é!"])
    assert s.feed("aé") == ("a", False) and s.feed("") == ("", False)
    assert s.feed("b", active=True) == ("éb", False)
    s = StopStrings(["ab"])
    assert s.feed("xa", active=False) == ("xa", False)  # inactive: nothing held, nothing cut
    assert s.feed("b") == ("b", False) and s.flush() == ""


def run(params: GenerationParams, ids: list[int]) -> tuple[str, list[Event]]:
    """The request's events with the text made on the engine thread; checked equal to the
    text made on the server's side from tokens-only events (an engine process's way)."""
    g = Generation(0, params, 3, TOK.eos_token_ids, RequestText(params, IncrementalText(TOK)))
    events = []
    for t in ids:
        events.append(g.push(t, 0.0))
        if events[-1].finish_reason:
            break
    assert server_side(params, ids) == events
    return "".join(e.text for e in events), events


def server_side(params: GenerationParams, ids: list[int]) -> list[Event]:
    """Tokens-only events through ``ServerTexts``, which stops the generation on a stop
    string as the engine process does on a "stop" (at the next token: one more is made)."""
    g = Generation(0, params, 3, TOK.eos_token_ids, None)
    texts = ServerTexts(TOK)
    texts.add(0, params)
    published = []
    for i, t in enumerate([*ids, 0]):  # a stop found at the last id ends it one token later
        if i == len(ids) and not g.stop_requested:
            break
        event = g.push(t, 0.0)
        assert event.text == ""
        out, stops = texts.apply([event])
        published += out
        if stops:
            assert stops == [0] and not g.stop_requested
            g.stop_requested = True
        if event.finish_reason:
            assert len(texts) == 0  # nothing held once the engine's last event is in
            break
    return published


def test_end_of_sequence_min_tokens_and_ignore_eos():
    ids = [*TOK.encode("abc"), 256, *TOK.encode("defgh")]
    text, ev = run(GenerationParams(max_tokens=20), ids)
    assert (text, len(ev), ev[-1].finish_reason) == ("abc", 4, "stop")
    text, ev = run(GenerationParams(max_tokens=6, min_tokens=5), ids)
    assert (text, len(ev), ev[-1].finish_reason) == ("abcde", 6, "length")  # eos kept, no text
    text, ev = run(GenerationParams(max_tokens=20, ignore_eos=True), ids)
    assert ev[-1].finish_reason is None and len(ev) == len(ids)
    p = GenerationParams(max_tokens=7, min_tokens=7, ignore_eos=True)
    assert p.forced_length
    text, ev = run(p, ids * 3)
    assert len(ev) == 7 and ev[-1].finish_reason == "length" and ev[-1].num_output_tokens == 7


def test_stop_string_in_multibyte_text():
    ids = TOK.encode("ab€cd€ef")
    text, ev = run(GenerationParams(max_tokens=30, stop=("d€",)), ids)
    assert text == "ab€c" and ev[-1].finish_reason == "stop"
    assert ev[-1].num_output_tokens == len("ab€cd€".encode())
    text, _ = run(GenerationParams(max_tokens=30, stop=("€",), min_tokens=6), ids)
    assert text == "ab€cd"  # the first "€" came before min_tokens
    text, ev = run(GenerationParams(max_tokens=4, stop=("zz",)), TOK.encode("abz") + [122])
    assert (text, ev[-1].finish_reason) == ("ab", "stop")  # the last token completes a stop


def test_length_flushes_held_text():
    text, ev = run(GenerationParams(max_tokens=4, stop=("cdX",)), TOK.encode("abcdef"))
    assert text == "abcd" and ev[-1].finish_reason == "length"


def test_metrics_exposition():
    m = ServingMetrics('my"model')
    m.arrived(5)
    for t, last, fin in [(1.0, None, None), (1.5, 1.0, None), (1.75, 1.5, "length")]:
        m.observe(Event(0, "x", (1,), 3, fin, t), 0.9, last)
    text = m.render(Stats(running=1, waiting=2, kv_used_blocks=3, num_blocks=12), 2)
    lines = text.splitlines()
    assert 'vllm:kv_cache_usage_perc{model_name="my\\"model"} 0.25' in lines
    assert 'vllm:num_requests_waiting{model_name="my\\"model"} 2' in lines
    assert any(
        x.startswith("vllm:time_to_first_token_seconds_count{") and x.endswith(" 1") for x in lines
    )
    assert any(
        x.startswith("vllm:inter_token_latency_seconds_count{") and x.endswith(" 2") for x in lines
    )
    inf = [
        x for x in lines if x.startswith("vllm:e2e_request_latency_seconds_bucket") and "+Inf" in x
    ]
    assert inf and inf[0].endswith(" 1")
    assert 'finished_reason="length"} 1' in text
    for x in lines:  # every sample line: name{labels} value
        if not x.startswith("#"):
            name, value = x.rsplit(" ", 1)
            float(value)
            assert name.startswith("vllm:") and name.endswith("}")


def test_bad_generation_params():
    with pytest.raises(ValueError, match="min_tokens"):
        GenerationParams(max_tokens=3, min_tokens=4)
    with pytest.raises(ValueError, match="stop"):
        GenerationParams(max_tokens=3, stop=("",))
