"""Stacked text features of the reply so far (``predictors.reply_text``) and the list-pace
features of ``predictors.progress``: what they read, and that they read nothing past ``g``."""

from __future__ import annotations

import numpy as np
import pytest

from horizon.workload.tokenized import encode_text, load_tokenizer
from predictors.length_model import REPLY_TEXT_FEATURES
from predictors.progress import TEXT_PROGRESS_FEATURES, TokenClasses
from predictors.reply_text import CHECKPOINTS, ReplyTextModel, checkpoint_of, id_bag

F = {name: i for i, name in enumerate(TEXT_PROGRESS_FEATURES)}


def test_id_bag_counts_ids_and_bigrams_of_the_slice_only():
    outs = [(5, 6, 5, 7, 9)]
    x = id_bag(outs, np.array([0]), np.array([1]), np.array([4]))  # ids 6, 5, 7
    assert x.sum() == 3 + 2  # three ids, two bigrams inside the slice
    assert x[0, 5] == 1 and x[0, 6] == 1 and x[0, 7] == 1 and x[0, 9] == 0
    plain = id_bag(outs, np.array([0, 0]), np.array([0, 4]), np.array([2, 4]), bigrams=False)
    assert plain[0].sum() == 2 and plain[1].sum() == 0  # an empty slice is an empty row


def test_checkpoint_is_the_largest_one_not_past_g():
    g = np.array([0, 15, 16, 31, 32, 100, 255, 256, 5000])
    assert checkpoint_of(g).tolist() == [0, 0, 16, 16, 32, 64, 128, 256, 256]
    assert CHECKPOINTS[0] == 16


def _synthetic(n: int, seed: int):
    """Replies whose first token tells their length (a learnable cue) and random others."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 400, n)
    outs = [(int(t) // 40 + 1000, *rng.integers(2000, 2300, int(t) - 1).tolist()) for t in lengths]
    return outs, lengths.astype(np.float64), np.arange(n)


def test_reply_text_model_learns_a_prefix_cue_and_reads_no_future_tokens():
    outs, lengths, groups = _synthetic(400, 0)
    rows = np.repeat(np.arange(len(outs)), 4)
    g = np.tile(np.array([1.0, 16.0, 17.0, 19.0]), len(outs))
    model = ReplyTextModel(window=8, alpha=1.0, neighbors=3, max_df=0.5, folds=3)
    oof = model.fit_oof(outs, lengths, groups, rows, g)
    assert oof.shape == (len(rows), len(REPLY_TEXT_FEATURES))
    assert np.isnan(oof[g < 16, :-1]).all() and np.isfinite(oof[:, -1]).all()
    # out of fold, the prefix ridge still ranks lengths from the first token
    at16 = g == 16
    assert np.corrcoef(oof[at16, 0], np.log(lengths[rows[at16]]))[0, 1] > 0.6
    # new replies: perturbing ids[g:] changes nothing at (r, g)
    test, _, _ = _synthetic(20, 1)
    rng = np.random.default_rng(2)
    for gv in (1, 16, 17, 33, 64, 130):
        r = np.arange(len(test))
        gg = np.full(len(test), float(gv))
        keep = np.asarray([len(o) > gv for o in test])
        r, gg = r[keep], gg[keep]
        fake = [o[:gv] + tuple(rng.integers(0, 150000, max(len(o) - gv, 0)).tolist()) for o in test]
        a, b = model.features(test, r, gg), model.features(fake, r, gg)
        assert np.array_equal(a, b, equal_nan=True), gv
        assert np.isfinite(a[:, -1]).all() and np.isfinite(a[:, 0]).all() == (gv >= 16)
    # ... while a different past does change them
    other = [(o[0] + 1,) + o[1:] for o in test]
    r, gg = np.arange(len(test)), np.full(len(test), 16.0)
    assert not np.array_equal(model.features(test, r, gg), model.features(other, r, gg))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_list_pace_features_of_a_hand_made_reply(tok):
    text = "Ideas:\n1. Apples are red\n2. Pears are green\n3. Plums are blue\n"
    ids = encode_text(tok, text)
    rows = TokenClasses.for_tokenizer(tok).progress(ids).at(np.arange(len(ids) + 1))
    first = len(encode_text(tok, "Ideas:\n"))  # the position of "1"
    assert ids[:first] == encode_text(tok, "Ideas:\n")
    before = rows[first]  # "1" not read yet
    assert np.isnan(before[F["log_first_item"]]) and np.isnan(before[F["log_tokens_per_item"]])
    one = rows[first + 1]
    assert np.expm1(one[F["log_first_item"]]) == pytest.approx(first)
    assert np.isnan(one[F["log_tokens_per_item"]])  # the pace needs two items
    end = rows[-1]
    pace = (len(ids) - first) / 3  # three items since the first one
    assert np.expm1(end[F["log_tokens_per_item"]]) == pytest.approx(pace)
    paragraphs = 0  # no blank line: one paragraph so far
    assert np.expm1(end[F["log_tokens_per_paragraph"]]) == pytest.approx(
        len(ids) / (paragraphs + 1)
    )
