"""Cluster workload shapes: shared-prefix groups, hash-id traces, closed-loop sessions."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from itertools import combinations, pairwise
from pathlib import Path

import numpy as np
import pytest

from horizon.kv_cache import chained_block_hashes
from horizon.workload import (
    Session,
    SessionConfig,
    SharedPrefixConfig,
    build_sessions,
    build_shared_prefix,
    load_hash_trace,
    session_requests,
)
from horizon.workload.shared_prefix import group_weights

SAMPLE = Path(__file__).resolve().parent / "data" / "hash_trace_sample.jsonl"
KV_BLOCK = 16  # Horizon's prefix-cache block size


def _shared_blocks(a, b) -> int:
    """Equal leading chained 16-token block hashes of two prompts (what prefix caching reuses)."""
    ha = chained_block_hashes(a.prompt_token_ids, KV_BLOCK)
    hb = chained_block_hashes(b.prompt_token_ids, KV_BLOCK)
    n = 0
    for x, y in zip(ha, hb, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- shared prefix ---------------------------------------------------------------------------


def _synthetic(**kw) -> SharedPrefixConfig:
    base = dict(
        num_requests=120,
        num_groups=4,
        prefix_tokens=100,  # 6 full blocks, the 7th straddles prefix and question
        question_tokens=40,
        output_tokens=16,
        rate=10.0,
        seed=3,
    )
    return SharedPrefixConfig(**{**base, **kw})


def test_shared_prefix_groups_share_exactly_their_prefix():
    cfg = _synthetic()
    reqs = build_shared_prefix(cfg, None)
    assert [r.request_id for r in reqs] == list(range(cfg.num_requests))
    assert all(b.arrival_time >= a.arrival_time for a, b in pairwise(reqs))
    assert all(r.num_prompt_tokens == 140 and r.turn_index == 0 for r in reqs)
    assert all(r.true_output_tokens == 16 and r.output_token_ids is None for r in reqs)
    groups = {r.conversation_id for r in reqs}
    assert groups == set(range(cfg.num_groups))
    questions = [r.prompt_token_ids[cfg.prefix_tokens :] for r in reqs]
    assert len(set(questions)) == len(reqs)  # distinct per request
    full = cfg.prefix_tokens // KV_BLOCK
    for a, b in combinations(reqs[:60], 2):
        if a.conversation_id == b.conversation_id:
            assert (
                a.prompt_token_ids[: cfg.prefix_tokens] == b.prompt_token_ids[: cfg.prefix_tokens]
            )
            assert _shared_blocks(a, b) == full
        else:
            assert _shared_blocks(a, b) == 0


def test_shared_prefix_zipf_skews_group_counts():
    n, k = 3000, 8
    zipf = build_shared_prefix(
        _synthetic(num_requests=n, num_groups=k, group_popularity="zipf", zipf_s=1.2), None
    )
    uniform = build_shared_prefix(_synthetic(num_requests=n, num_groups=k), None)
    zc = Counter(r.conversation_id for r in zipf)
    uc = Counter(r.conversation_id for r in uniform)
    w = group_weights(_synthetic(num_groups=k, group_popularity="zipf", zipf_s=1.2))
    assert all(abs(zc[g] / n - w[g]) < 0.03 for g in range(k))
    assert zc[0] > 5 * zc[k - 1]
    assert max(uc.values()) < 1.4 * min(uc.values())


def test_shared_prefix_is_deterministic_from_the_seed():
    def ids(reqs):
        return [(r.prompt_token_ids, r.arrival_time, r.conversation_id) for r in reqs]

    cfg = _synthetic(arrival="gamma", burstiness=0.5)
    assert ids(build_shared_prefix(cfg, None)) == ids(build_shared_prefix(cfg, None))
    other = build_shared_prefix(_synthetic(arrival="gamma", burstiness=0.5, seed=4), None)
    assert ids(other) != ids(build_shared_prefix(cfg, None))


def test_shared_prefix_takes_questions_and_replies_from_the_corpus(sharegpt_head):
    cfg = SharedPrefixConfig(
        num_requests=100, num_groups=3, prefix_tokens=64, max_output_tokens=128, seed=1
    )
    reqs = build_shared_prefix(cfg, sharegpt_head)
    assert build_shared_prefix(cfg, sharegpt_head)[7].prompt_token_ids == reqs[7].prompt_token_ids
    questions = [r.prompt_token_ids[64:] for r in reqs]
    assert len(set(questions)) == len(reqs) and all(questions)
    assert all(len(q) <= cfg.max_question_tokens for q in questions)
    for r in reqs:
        assert len(r.output_token_ids) == r.true_output_tokens <= 128
    assert any(r.true_output_tokens == 128 for r in reqs)  # long replies are capped
    assert len({r.true_output_tokens for r in reqs}) > 10  # lengths come from the replies
    by_group = {}
    for r in reqs:
        by_group.setdefault(r.conversation_id, []).append(r)
    assert len(by_group) == 3
    for g, members in by_group.items():
        assert all(m.prompt_token_ids[:64] == members[0].prompt_token_ids[:64] for m in members)
        assert all(_shared_blocks(members[0], m) >= 4 for m in members[1:])
        other = by_group[(g + 1) % 3][0]
        assert _shared_blocks(members[0], other) == 0


def test_shared_prefix_needs_a_corpus_for_corpus_fields():
    with pytest.raises(ValueError, match="question_tokens and output_tokens"):
        build_shared_prefix(_synthetic(question_tokens=None), None)
    with pytest.raises(ValueError, match="question_tokens and output_tokens"):
        build_shared_prefix(_synthetic(output_tokens=None), None)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_requests", 0),
        ("num_groups", 0),
        ("prefix_tokens", 0),
        ("question_tokens", 0),
        ("max_question_tokens", 0),
        ("output_tokens", 0),
        ("output_tokens", 5000),
        ("max_output_tokens", 0),
        ("group_popularity", "pareto"),
        ("zipf_s", 0.0),
        ("rate", float("inf")),
        ("arrival", "trace"),
        ("burstiness", -1.0),
        ("seed", -1),
        ("vocab_size", 1),
        ("slo_ttft", 0.5),  # without slo_itl
        ("slo_itl", -1.0),
    ],
)
def test_shared_prefix_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SharedPrefixConfig\.{field}"):
        _synthetic(**{field: value})


def test_shared_prefix_config_rejects_too_few_distinct_questions():
    with pytest.raises(ValueError, match="SharedPrefixConfig.question_tokens"):
        _synthetic(question_tokens=1, vocab_size=50, num_requests=51)


# -- hash-id traces --------------------------------------------------------------------------


def _records() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def _leading_common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_hash_trace_prefix_sharing_matches_hash_ids():
    reqs = load_hash_trace(SAMPLE)
    recs = sorted(_records(), key=lambda r: r["timestamp"])  # the loader's (stable) order
    assert len(reqs) == len(recs) == 14
    per_id = 512 // KV_BLOCK
    checked = Counter()
    for (a, ra), (b, rb) in combinations(zip(reqs, recs, strict=True), 2):
        s = _leading_common(ra["hash_ids"], rb["hash_ids"])
        want = min(per_id * s, min(a.num_prompt_tokens, b.num_prompt_tokens) // KV_BLOCK)
        assert _shared_blocks(a, b) == want, (ra, rb)
        checked["shared" if want else "none"] += 1
    assert checked["shared"] >= 15 and checked["none"] >= 30


def test_hash_trace_fields_times_and_lengths():
    reqs = load_hash_trace(SAMPLE, max_output_tokens=2048, time_scale=2.0)
    recs = sorted(_records(), key=lambda r: r["timestamp"])
    first = recs[0]["timestamp"]
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    for r, rec in zip(reqs, recs, strict=True):
        assert r.arrival_time == pytest.approx((rec["timestamp"] - first) / 1000 / 2.0)
        assert r.num_prompt_tokens == len(r.prompt_token_ids) == rec["input_length"]
        assert r.true_output_tokens == min(max(rec["output_length"], 1), 2048)
        assert all(0 <= t < 151_000 for t in r.prompt_token_ids)
    assert {r.true_output_tokens for r in reqs} >= {1, 2048}  # 0 and 3000 clamped
    assert all(b.arrival_time >= a.arrival_time for a, b in pairwise(reqs))
    assert len(load_hash_trace(SAMPLE, limit=5)) == 5


def test_hash_trace_is_deterministic_and_reads_gzip(tmp_path):
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    plain = [r.prompt_token_ids for r in load_hash_trace(SAMPLE, seed=5)]
    assert [r.prompt_token_ids for r in load_hash_trace(gz, seed=5)] == plain
    assert [r.prompt_token_ids for r in load_hash_trace(SAMPLE, seed=6)] != plain


@pytest.mark.parametrize(
    "bad, field",
    [
        (
            '{"timestamp": 5, "input_length": "12", "output_length": 3, "hash_ids": [1]}',
            "input_length",
        ),
        (
            '{"timestamp": 5, "input_length": 12, "output_length": -3, "hash_ids": [1]}',
            "output_length",
        ),
        (
            '{"timestamp": 5, "input_length": 12, "output_length": 3, "hash_ids": [1, -2]}',
            "hash_ids",
        ),
        (
            '{"timestamp": NaN, "input_length": 12, "output_length": 3, "hash_ids": [1]}',
            "timestamp",
        ),
        ('{"timestamp": 5, "input_length": 12, "output_length": 3}', "hash_ids"),
        ('{"timestamp": 5, "input_length": 12,', "JSON"),
        ("[1, 2, 3]", "JSON object"),
    ],
)
def test_hash_trace_malformed_line_names_line_and_field(tmp_path, bad, field):
    lines = SAMPLE.read_text().splitlines()[:2]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([lines[0], "", lines[1], bad, lines[0]]) + "\n")
    with pytest.raises(ValueError, match=rf"line 4: .*{field}"):
        load_hash_trace(path)


def test_hash_trace_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        load_hash_trace(SAMPLE, block_size=0)
    with pytest.raises(ValueError, match="time_scale"):
        load_hash_trace(SAMPLE, time_scale=0.0)
    with pytest.raises(ValueError, match="limit"):
        load_hash_trace(SAMPLE, limit=0)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty trace"):
        load_hash_trace(tmp_path / "empty.jsonl")


# -- sessions --------------------------------------------------------------------------------


def test_sessions_turns_extend_each_other(sharegpt_head):
    cfg = SessionConfig(num_sessions=60, think_time_mean=2.0, seed=1)
    sessions = build_sessions(cfg, sharegpt_head)
    assert [s.session_id for s in sessions] == list(range(60))
    flat = session_requests(sessions)
    assert [r.request_id for r in flat] == list(range(len(flat)))
    assert len({s.requests[0].conversation_id for s in sessions}) == 60
    multi = [s for s in sessions if len(s.requests) > 1]
    assert len(multi) >= 20
    for s in sessions:
        assert len(s.think_times) == len(s.requests) - 1
        assert all(t >= 0 for t in s.think_times)
        assert s.requests[0].arrival_time == s.start
        assert all(r.arrival_time == 0.0 for r in s.requests[1:])  # placeholders
        assert [r.turn_index for r in s.requests] == list(range(len(s.requests)))
        for r in s.requests:
            assert len(r.output_token_ids) == r.true_output_tokens <= cfg.max_output_tokens
            assert r.num_prompt_tokens <= cfg.max_prompt_tokens
        for a, b in pairwise(s.requests):
            assert b.prompt_token_ids[: a.num_prompt_tokens] == a.prompt_token_ids
            assert b.prompt_token_ids[a.num_prompt_tokens :][: a.true_output_tokens] == (
                a.output_token_ids
            )
            ha = chained_block_hashes(a.prompt_token_ids, KV_BLOCK)
            assert chained_block_hashes(b.prompt_token_ids, KV_BLOCK)[: len(ha)] == ha
    assert all(b.start >= a.start for a, b in pairwise(sessions))


def test_sessions_start_rate_and_think_times(sharegpt_head):
    cfg = SessionConfig(num_sessions=200, session_rate=4.0, think_time_mean=3.0, seed=2)
    sessions = build_sessions(cfg, sharegpt_head)
    starts = np.array([s.start for s in sessions])
    assert starts[0] == 0.0 and np.all(np.diff(starts) >= 0)
    assert abs(starts[-1] / 199 - 0.25) < 0.3 * 0.25
    thinks = [t for s in sessions for t in s.think_times]
    assert len(thinks) > 100 and abs(np.mean(thinks) - 3.0) < 0.3 * 3.0
    zero = build_sessions(SessionConfig(num_sessions=30, think_time_mean=0.0), sharegpt_head)
    assert all(t == 0.0 for s in zero for t in s.think_times)


def test_sessions_turn_limits_and_determinism(sharegpt_head):
    few = build_sessions(SessionConfig(num_sessions=40, max_turns=2, seed=3), sharegpt_head)
    assert all(1 <= len(s.requests) <= 2 for s in few)
    many = build_sessions(SessionConfig(num_sessions=40, min_turns=3, seed=3), sharegpt_head)
    assert all(len(s.requests) >= 3 for s in many)
    again = build_sessions(SessionConfig(num_sessions=40, min_turns=3, seed=3), sharegpt_head)
    assert [[r.prompt_token_ids for r in s.requests] for s in again] == [
        [r.prompt_token_ids for r in s.requests] for s in many
    ]
    assert [s.think_times for s in again] == [s.think_times for s in many]
    with pytest.raises(ValueError, match="too few ShareGPT sessions"):
        build_sessions(SessionConfig(num_sessions=10_000), sharegpt_head)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_sessions", 0),
        ("max_turns", 0),
        ("min_turns", 0),
        ("session_rate", 0.0),
        ("think_time_mean", -1.0),
        ("max_output_tokens", 0),
        ("min_prompt_tokens", -1),
        ("min_output_tokens", 4096),
        ("max_prompt_tokens", 0),
        ("max_total_tokens", 0),
        ("seed", 1.5),
        ("slo_ttft", float("nan")),
        ("slo_itl", 0.1),  # without slo_ttft
    ],
)
def test_session_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SessionConfig\.{field}"):
        SessionConfig(**{field: value})


def test_session_checks_its_contract(sharegpt_head):
    s = build_sessions(SessionConfig(num_sessions=20, min_turns=2, seed=4), sharegpt_head)[0]
    with pytest.raises(ValueError, match="Session.think_times"):
        Session(s.session_id, s.requests, s.think_times + (1.0,), s.start)
    with pytest.raises(ValueError, match="Session.think_times"):
        Session(s.session_id, s.requests, (-1.0,) * len(s.think_times), s.start)
    with pytest.raises(ValueError, match="Session.start"):
        Session(s.session_id, s.requests, s.think_times, s.start + 1.0)
