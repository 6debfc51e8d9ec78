"""The learned predictor's remaining-length model (``length_model.RemainingModel``): its grid,
its per-band residual calibration, its online interpolation, and its accuracy on held-out
conversations of a small real ShareGPT corpus."""

from __future__ import annotations

import numpy as np
import pytest

from horizon.request import Request
from predictors import LEVELS, make_predictor
from predictors.calibration import ResidualQuantiles, progress_points
from predictors.evaluation import remaining_cases, score
from predictors.features import NUMERIC_FEATURES, numeric_row, parse_prompt
from predictors.learned import LearnedPredictor, _interpolate
from predictors.length_model import PROGRESS_FEATURES, remaining_grid


def test_grid_is_increasing_below_hi_and_a_prefix_across_limits():
    big = remaining_grid(2048)
    assert big[0] == 1 and all(b > a for a, b in zip(big, big[1:])) and big[-1] < 2048
    assert len(big) < 30  # prepare tabulates this many points per request
    for hi in (1, 2, 17, 64, 65, 1000, 1025, 2047):
        g = remaining_grid(hi)
        assert g == big[: len(g)] and all(x < hi for x in g[1:])
    assert remaining_grid(8192)[: len(big)] == big


def test_residual_quantiles_calibrate_per_band():
    rng = np.random.default_rng(0)
    g = rng.integers(1, 1200, 20000).astype(float)
    z = rng.normal(size=g.size) * np.where(g < 256, 1.0, 0.3)  # narrower late in a reply
    rq = ResidualQuantiles.fit((0.1, 0.5, 0.9), z, g)
    for lo, hi in ((1, 256), (256, 1200)):
        sel = (g >= lo) & (g < hi)
        row = np.asarray(rq.rows(g[sel]))
        cov = (z[sel, None] <= row).mean(0)
        assert np.allclose(cov, (0.1, 0.5, 0.9), atol=0.03)
    assert rq.row(10)[2] > 2 * rq.row(500)[2]  # the band's own spread, not a pooled one
    assert rq.row(0) == rq.row(1)  # below the first edge: the first band
    with pytest.raises(ValueError, match="no held-out points"):
        ResidualQuantiles.fit((0.5,), np.array([]), np.array([]))


def _without_reply(r: Request) -> Request:
    """A copy without its reply ids (an engine replay file may lack them)."""
    return Request(r.request_id, r.arrival_time, r.num_prompt_tokens, r.max_output_tokens,
                   r.true_output_tokens, prompt_token_ids=r.prompt_token_ids,
                   conversation_id=r.conversation_id, turn_index=r.turn_index)  # fmt: skip


def test_interpolation_matches_the_online_path(split, fitted):
    """Requests without reply ids: the prompt-only remaining model, interpolated over g."""
    reqs = [_without_reply(r) for r in split.test[:30]]
    fitted.prepare(reqs)
    grid, m_tab, s_tab = fitted._tables(fitted._model.design(fitted._extract(reqs)), 2048)
    rows = np.repeat(np.arange(len(reqs)), 4)
    g = np.tile(np.array([1.0, 40.0, 700.0, 2000.0]), len(reqs))
    m, sc = _interpolate(grid, m_tab, rows, g), _interpolate(grid, s_tab, rows, g)
    z50 = [fitted._remaining_z.row(gi)[LEVELS.index(0.5)] for gi in g]
    for i, (row, gi) in enumerate(zip(rows, g, strict=True)):
        _, _, _, gr, loc, scl, _, stepwise = fitted._entry(reqs[row])
        assert not stepwise
        assert gr == grid
        if gi == 1.0:
            assert loc[0] == pytest.approx(m_tab[row, 0])
        if gi == 40.0:  # halfway between 32 and 48
            assert m[i] == pytest.approx((m_tab[row, 2] + m_tab[row, 3]) / 2)
        if gi == 2000.0:  # flat past the grid's end
            assert m[i] == pytest.approx(m_tab[row, -1])
        median = fitted.update(reqs[row], int(gi)).median
        assert median == pytest.approx(min(np.exp(m[i] + sc[i] * z50[i]), 2048 - gi), rel=1e-9)


def test_remaining_median_follows_progress(split, fitted):
    """The remaining median given g tokens generated is a median of what is left for the
    requests that got that far: calibrated on held-out survivors at g = 64 and 256 (at 256,
    carrying the prompt-time median forward minus g is not); typically less is left 64 tokens
    in than at the start; late in a reply it stays sizeable.
    (The prompt-only model; with the reply's text, an open code block may well say more.)"""
    reqs = [_without_reply(r) for r in split.test]
    fitted.prepare(reqs)
    med = np.array([[fitted.update(r, g).median for g in (0, 64, 256, 768)] for r in reqs])
    true = np.array([r.true_output_tokens for r in reqs])
    assert np.all(med > 0)
    for col, g, tol in ((1, 64, 0.06), (2, 256, 0.1)):  # about 2.5 binomial s.e. at n = 420, 209
        alive = true > g
        assert alive.sum() > 150
        assert abs(np.mean(true[alive] - g <= med[alive, col]) - 0.5) <= tol
    alive = true > 256
    carried = np.maximum(med[alive, 0] - 256, 1)  # 0.21 on this split: far from a median
    assert np.mean(true[alive] - 256 <= carried) < 0.35
    assert np.median(med[:, 1] / med[:, 0]) < 0.9  # 64 tokens in: less left than at the start
    late = med[:, 0] < 700
    assert late.sum() > 50 and np.median(med[late, 3]) > 5


def test_header_and_round_trip_of_the_remaining_model(tmp_path, split, fitted):
    h = fitted.header
    assert h["version"] == 4
    assert h["remaining_feature_names"][-2:] == list(PROGRESS_FEATURES)
    assert h["remaining_calibration_points"] > 100
    loaded = LearnedPredictor.load(fitted.save(tmp_path / "m.joblib"), threads=1)
    reqs = split.test[:40]
    loaded.prepare(reqs)
    fitted.prepare(reqs)
    for r in reqs:
        for g in (1, 7, 16, 100, 333, 1500, 2047):
            assert loaded.update(r, g) == fitted.update(r, g)
    # an unprepared request gets the same answer, computed on the spot
    loaded.prepare([])
    assert loaded.update(reqs[0], 100) == fitted.update(reqs[0], 100)


def test_beats_the_baseline_and_stays_calibrated_on_held_out(split, fitted):
    fitted.prepare(split.test)
    dists, truth, g = remaining_cases(fitted, split.test, step=16)
    rem = score(dists, truth)
    base = make_predictor("prompt_length").fit(split.train)
    base_rem = score(*remaining_cases(base, split.test, step=16)[:2])
    assert rem.mae < 0.85 * base_rem.mae
    assert 0.82 <= rem.coverage_at(0.9) <= 0.97
    late = g >= 128
    q90 = np.asarray([d.quantile(0.9) for d, k in zip(dists, late, strict=True) if k])
    assert 0.75 <= (truth[late] <= q90).mean() <= 0.98


def test_new_prompt_features_read_the_previous_reply(sharegpt_head, split):
    r = next(r for r in split.test if r.turn_index >= 1)
    view = parse_prompt(r.prompt_token_ids, sharegpt_head.template)
    names = list(NUMERIC_FEATURES)
    cut = numeric_row(r, view, "please continue", "```python\nx = 1\n")
    done = numeric_row(r, view, "Why? And how?", "All done.")
    assert cut[names.index("prev_unclosed_code")] == 1.0
    assert done[names.index("prev_unclosed_code")] == 0.0
    assert cut[names.index("prev_ends_complete")] == 0.0
    assert done[names.index("prev_ends_complete")] == 1.0
    assert done[names.index("log_questions")] == pytest.approx(np.log1p(2))
    first = next(r for r in split.test if r.turn_index == 0)
    row = numeric_row(first, parse_prompt(first.prompt_token_ids, sharegpt_head.template), "hi")
    assert np.isnan(row[names.index("prev_unclosed_code")])
    assert len(row) == len(NUMERIC_FEATURES)


def test_progress_points_cover_every_step():
    rows, g = progress_points(np.array([1, 16, 17, 40]), 16)
    assert rows.tolist() == [0, 1, 2, 2, 3, 3, 3]
    assert g.tolist() == [0, 0, 0, 16, 0, 16, 32]
