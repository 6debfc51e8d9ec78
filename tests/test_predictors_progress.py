"""Features of the reply generated so far (``predictors.progress``) and the learned predictor's
remaining-length model that reads them: correct on a hand-made reply, and no leakage (nothing
from ``output_token_ids[g:]`` reaches ``update(r, g)``)."""

from __future__ import annotations

import numpy as np
import pytest

from horizon.request import Request
from horizon.workload.tokenized import encode_text, load_tokenizer
from predictors.progress import TEXT_PROGRESS_FEATURES, TokenClasses

F = {name: i for i, name in enumerate(TEXT_PROGRESS_FEATURES)}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_features_of_a_hand_made_reply(tok):
    pieces = ["Here is:\n\n", "1. First\n", "2. Second\n", "```python\nx = 1\n```\n",
              "In summary, it works. I hope this helps!"]  # fmt: skip
    ids = encode_text(tok, "".join(pieces))
    c = TokenClasses.for_tokenizer(tok)
    rows = c.progress(ids).at(np.arange(len(ids) + 1))
    assert rows.shape == (len(ids) + 1, len(TEXT_PROGRESS_FEATURES))

    def at(prefix: str) -> np.ndarray:
        n = len(encode_text(tok, prefix))
        assert ids[:n] == encode_text(tok, prefix)
        return rows[n]

    empty = rows[0]
    assert empty[F["log_newlines"]] == 0 and np.isnan(empty[F["log_since_newline"]])
    r = at("Here is:\n\n")
    assert np.expm1(r[F["log_newlines"]]) == pytest.approx(2)
    assert np.expm1(r[F["log_paragraphs"]]) == pytest.approx(1)
    assert r[F["log_since_newline"]] == 0  # the last token ends the line
    assert np.expm1(r[F["log_intro_colons"]]) == pytest.approx(1)
    r = at("".join(pieces[:3]))
    assert np.expm1(r[F["log_items"]]) == pytest.approx(2) and r[F["last_item_number"]] == 2
    r = at("".join(pieces[:3]) + "```python\nx = 1\n")
    assert r[F["fences"]] == 1 and r[F["in_code"]] == 1  # inside an open code block
    r = at("".join(pieces[:4]))
    assert r[F["fences"]] == 2 and r[F["in_code"]] == 0  # closed (even if "```" is split)
    assert r[F["log_concluding"]] == 0 and np.isnan(r[F["log_since_concluding"]])
    r = rows[-1]
    # "In summary", "I hope", "hope this", "this helps"
    assert np.expm1(r[F["log_concluding"]]) == pytest.approx(4)
    assert r[F["log_since_sentence"]] == 0  # ends with "!"
    # clipped past the end: the whole reply
    assert np.array_equal(c.progress(ids).at([len(ids) + 50]), rows[-1:], equal_nan=True)


def test_each_row_reads_only_the_tokens_before_it(tok):
    rng = np.random.default_rng(0)
    ids = encode_text(tok, "Sure:\n\n1. a\n2. b\n```\ncode\n```\nIn summary, ok. Let me know!")
    c = TokenClasses.for_tokenizer(tok)
    full = c.progress(ids).at(np.arange(len(ids) + 1))
    for g in range(len(ids) + 1):
        other = list(ids[:g]) + rng.integers(0, 150000, len(ids) - g + 5).tolist()
        got = c.progress(other).at([g])[0]
        assert np.array_equal(got, full[g], equal_nan=True), g


def _with_reply(r: Request, ids) -> Request:  # noqa: ANN001
    return Request(r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_output_tokens,
                   len(ids), prompt_token_ids=r.prompt_token_ids,
                   conversation_id=r.conversation_id, turn_index=r.turn_index,
                   output_token_ids=tuple(ids))  # fmt: skip


def test_update_does_not_read_the_future_of_the_reply(split, fitted):
    """Perturbing ``output_token_ids[g:]`` (same length) leaves ``update(r, g)`` unchanged,
    prepared or not; and the reply-reading model is what prepared replies use."""
    rng = np.random.default_rng(1)
    reqs = [r for r in split.test if r.true_output_tokens >= 200][:8]
    assert len(reqs) == 8 and fitted._model.remaining_text is not None
    for r in reqs:
        t = r.true_output_tokens
        for g in (1, 15, 16, 17, 100, t // 2, t - 1):
            ids = list(r.output_token_ids)
            fake = ids[:g] + rng.integers(0, 150000, t - g).tolist()
            a, b = r, _with_reply(r, fake)
            fitted.prepare([])
            assert fitted.update(a, g) == fitted.update(b, g)  # unprepared
            fitted.prepare([a])
            da = fitted.update(a, g)
            assert fitted._entry(a)[7]  # stepwise: the reply-reading table
            fitted.prepare([b])
            assert da == fitted.update(b, g)
            assert da == (fitted.prepare([]) or fitted.update(a, g))  # same on both paths
    # the text does matter: a different past gives a different answer somewhere
    r = reqs[0]
    g = r.true_output_tokens // 2
    other = _with_reply(r, rng.integers(0, 150000, r.true_output_tokens).tolist())
    fitted.prepare([])
    assert any(fitted.update(r, x) != fitted.update(other, x) for x in (g, g + 16, g + 32))


def test_requests_without_reply_ids_use_the_prompt_only_model(split, fitted):
    r = split.test[0]
    bare = Request(r.request_id, 0.0, r.num_prompt_tokens, r.max_output_tokens,
                   r.true_output_tokens, prompt_token_ids=r.prompt_token_ids)  # fmt: skip
    fitted.prepare([bare])
    e = fitted._entry(bare)
    assert not e[7] and e[6] is fitted._remaining_z
    assert fitted.update(bare, 40).median > 0


def test_request_checks_the_reply_length():
    Request(0, 0.0, 3, 10, 2, output_token_ids=(5, 6))
    with pytest.raises(ValueError, match="output_token_ids"):
        Request(0, 0.0, 3, 10, 2, output_token_ids=(5, 6, 7))
