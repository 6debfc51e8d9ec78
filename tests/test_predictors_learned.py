"""The learned predictor on a small real ShareGPT corpus: fit, artifact round trip, memo,
remaining-length updates, calibration on held-out conversations, and no peeking at the truth."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from horizon.prediction import LengthDistribution
from horizon.request import Request
from horizon.workload.turns import answered_turns
from predictors import LEVELS, make_predictor
from predictors.evaluation import remaining_cases, score
from predictors.features import parse_prompt
from predictors.learned import LearnedPredictor


def _copy(r: Request, true: int | None = None) -> Request:
    return Request(
        r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_output_tokens,
        r.true_output_tokens if true is None else true, r.slo, r.prompt_token_ids,
        r.conversation_id, r.turn_index,
    )  # fmt: skip


def test_constructor_only_stores_and_predict_needs_fit(split):
    p = LearnedPredictor(seed=3, neighbors=5)
    assert p.header is None and p.artifact_path is None and p.settings.neighbors == 5
    with pytest.raises(ValueError, match="fit"):
        p.predict(split.test[0])
    with pytest.raises(ValueError, match="learning_rate"):
        LearnedPredictor(learning_rate=2.0)


def test_prompt_parsing_recovers_the_previous_reply(sharegpt_head, split, fitted):
    template = sharegpt_head.template
    later = [r for r in split.test if r.turn_index >= 1][:20]
    assert later
    for r in later:
        view = parse_prompt(r.prompt_token_ids, template)
        turns = list(answered_turns(sharegpt_head, r.conversation_id))
        k = r.turn_index
        assert view.templated
        assert view.user_ids == tuple(turns[k][1].tolist())
        assert view.reply_lengths == tuple(len(t[2]) for t in turns[:k])
        assert view.prev_reply_ids == tuple(turns[k - 1][2].tolist())
    first = next(r for r in split.test if r.turn_index == 0)
    assert parse_prompt(first.prompt_token_ids, template).reply_lengths == ()
    assert not parse_prompt((1, 2, 3), template).templated


def test_distributions_are_valid(split, fitted):
    for d, r in zip(fitted.predict_batch(split.test), split.test, strict=True):
        assert d.levels == LEVELS and d.lo == 1.0 and d.hi == r.max_output_tokens
        assert d.values[0] >= 1 and d.values[-1] <= d.hi
        assert all(b >= a for a, b in zip(d.values, d.values[1:]))


def test_save_load_round_trip(tmp_path, split, fitted):
    path = fitted.save(tmp_path / "sub" / "learned.joblib")
    assert fitted.artifact_path == path and (tmp_path / "sub" / "learned.joblib.json").exists()
    h = fitted.header
    assert h["train_fingerprint"]["requests"] == len(split.train)
    assert h["train_seed"] == 0 and h["sklearn_version"] and h["settings"]["neighbors"] == 10
    loaded = LearnedPredictor.load(path, threads=1)
    also = make_predictor("learned", artifact=path, threads=1)
    assert loaded.artifact_path == path and loaded.header == h
    a = [d.values for d in fitted.predict_batch(split.test)]
    assert [d.values for d in loaded.predict_batch(split.test)] == a
    assert [d.values for d in also.predict_batch(split.test)] == a
    loaded.prepare(split.test)
    fitted.prepare(split.test)
    for r in split.test[:50]:
        for g in (0, 16, 200, 900):
            assert loaded.update(r, g) == fitted.update(r, g)


def test_pickles_without_the_tokenizer(split, fitted):
    fitted.predict_batch(split.test[:2])  # the tokenizer is loaded now
    clone = pickle.loads(pickle.dumps(fitted))
    a = [d.values for d in fitted.predict_batch(split.test[:50])]
    assert [d.values for d in clone.predict_batch(split.test[:50])] == a


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        LearnedPredictor.load(tmp_path / "missing.joblib")
    bad = tmp_path / "bad.joblib"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a learned-predictor artifact"):
        LearnedPredictor.load(bad)


def test_never_reads_the_true_length(split, fitted):
    rng = np.random.default_rng(0)
    scrambled = [_copy(r, int(rng.integers(1, r.max_output_tokens + 1))) for r in split.test[:200]]
    a = fitted.predict_batch(split.test[:200])
    b = fitted.predict_batch(scrambled)
    assert [d.values for d in a] == [d.values for d in b]
    fitted.prepare(scrambled)
    for r in scrambled[:50]:
        assert fitted.update(r, 32) == fitted.update(_copy(r, 2048), 32)


def test_prepare_is_an_explicit_per_run_memo(split, fitted):
    reqs = split.test[:100]
    fitted.prepare(reqs)
    batch = fitted.predict_batch(reqs)
    assert [fitted.predict(r).values for r in reqs] == [d.values for d in batch]
    unprepared = split.test[200]
    assert fitted.predict(unprepared).values == fitted.predict_batch([unprepared])[0].values
    other = reqs[0]
    impostor = Request(other.request_id, 0.0, other.num_prompt_tokens + 1, 2048, 10)
    with pytest.raises(ValueError, match="prepare"):
        fitted.predict(impostor)
    fitted.prepare(split.test[100:110])  # replaced, not merged
    assert fitted.predict(other).values == batch[0].values  # recomputed, not memoised


def _at(r: Request, arrival: float, prompt: list[int] | None = None) -> Request:
    ids = r.prompt_token_ids if prompt is None else prompt
    return Request(
        r.request_id, arrival, len(ids), r.max_output_tokens, r.true_output_tokens, None,
        ids, r.conversation_id, r.turn_index, output_token_ids=r.output_token_ids,
    )  # fmt: skip


def test_preparing_the_same_requests_again_keeps_the_memo(split, fitted, monkeypatch):
    reqs = split.test[:60]
    fitted.prepare(reqs)
    before = [fitted.predict(r).values for r in reqs]
    calls: list[int] = []
    entries = fitted._entries
    monkeypatch.setattr(fitted, "_entries", lambda rs: calls.append(len(rs)) or entries(rs))
    later = [_at(r, r.arrival_time + 5.0) for r in reqs]  # another load: other arrival times
    fitted.prepare(later)
    assert calls == [] and [fitted.predict(r).values for r in later] == before
    changed = [*later[:-1], _at(later[-1], 0.0, [*later[-1].prompt_token_ids, 7])]
    fitted.prepare(changed)  # one prompt differs: prepared again
    assert calls == [60]
    assert fitted.predict(changed[-1]).values == fitted.predict_batch(changed[-1:])[0].values


def test_update_shrinks_sensibly(split, fitted):
    reqs = split.test
    fitted.prepare(reqs)
    for r in reqs[:100]:
        assert fitted.update(r, 0) == fitted.predict(r)
        for g in (1, 64, 300, 1000, 2047):
            d = fitted.update(r, g)
            assert isinstance(d, LengthDistribution)
            assert d.values[0] >= 1 and d.values[-1] <= d.hi <= r.max_output_tokens - g
        done = fitted.update(r, r.max_output_tokens)
        assert done.values == tuple(1.0 for _ in LEVELS)
    # Early on (g well before the predicted median), the remaining median is mostly below the
    # total's. Not always: the remaining model is fitted on its own, and for a prompt whose
    # replies are either short or long, having survived the short mode means more is left
    # (on the full ShareGPT test split this holds for ~74% of such points: the reply-reading
    # model raises its estimate when the reply so far looks long, e.g. a long list has begun).
    pairs = [(r, g) for r in reqs[:200] for g in (16, 64, 128) if fitted.predict(r).cdf(g) <= 0.4]
    assert len(pairs) > 100
    total = {r.request_id: fitted.predict(r).median for r, _ in pairs}
    rem = [(fitted.update(r, g).median, total[r.request_id], g) for r, g in pairs]
    assert np.mean([m < t for m, t, _ in rem]) >= 0.65


def test_calibrated_on_held_out_conversations(split, fitted):
    fitted.prepare(split.test)
    total = score(
        [fitted.predict(r) for r in split.test], [r.true_output_tokens for r in split.test]
    )
    dists, truth, _ = remaining_cases(fitted, split.test, step=16)
    remaining = score(dists, truth)
    base = make_predictor("prompt_length").fit(split.train)
    base_rem = score(*remaining_cases(base, split.test, step=16)[:2])
    assert 0.78 <= total.coverage_at(0.9) <= 0.98
    assert 0.78 <= remaining.coverage_at(0.9) <= 0.98
    assert 0.35 <= remaining.coverage_at(0.5) <= 0.65
    assert total.spearman > 0.25
    assert remaining.mae < base_rem.mae  # beats the prompt-length baseline carried forward
