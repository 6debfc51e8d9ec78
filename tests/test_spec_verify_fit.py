"""experiments.spec_verify_fit: the host terms of verification steps recovered from runs made
with known terms, and the crossover read from the cells."""

from __future__ import annotations

import pytest

from experiments import spec_verify_fit as vf


def _cells() -> list[dict]:
    return [
        {"set": "fit", "drafter": "ngram", "alpha": 0.7, "batch": b, "k": k}
        for b in (1, 2, 4)
        for k in (1, 2, 4)
    ]


def test_the_fit_recovers_the_terms_an_engine_with_them_would_show():
    """An 'engine' 1.3x slower than the simulator on every step, with 0.4 ms per verification
    step and 0.05 ms per verifying request on top: the plain calibration removes the 1.3x and
    the fit finds the two terms."""
    cells = _cells()
    vf.simulate_cells(cells)
    for c in cells:
        assert c["verify_steps"] > 0 and c["verifies"] >= c["verify_steps"]
        truth = c["sim_rows_s"] + 4e-4 * c["verify_steps"] + 5e-5 * c["verifies"]
        c["wall_s"], c["plain_wall_s"] = 1.3 * truth, 1.3 * c["sim_plain_s"]
        c["speedup"] = c["plain_wall_s"] / c["wall_s"]
    per_step, per_verify = vf.fit_terms(cells)
    assert per_step == pytest.approx(4e-4, rel=1e-6)
    assert per_verify == pytest.approx(5e-5, rel=1e-5)
    vf.speedups(cells, per_step, per_verify)
    for c in cells:
        assert c["sim_fitted_speedup"] == pytest.approx(c["speedup"], rel=1e-6)
        assert c["sim_rows_speedup"] > c["sim_fitted_speedup"]  # the terms only add time


def test_terms_that_would_be_negative_are_dropped():
    """An 'engine' faster than the decode-row price: no term can explain it, both are 0."""
    cells = _cells()
    vf.simulate_cells(cells)
    for c in cells:
        c["wall_s"], c["plain_wall_s"] = 0.8 * c["sim_rows_s"], c["sim_plain_s"]
    assert vf.fit_terms(cells) == (0.0, 0.0)


def test_the_crossover_is_the_first_batch_slower_than_plain():
    cells = [
        {"set": "fit", "drafter": "ngram", "alpha": 0.7, "batch": b, "k": 4, "speedup": s}
        | {f"sim_{v}_speedup": t for v in vf.VARIANTS}
        for b, s, t in ((1, 2.0, 2.1), (4, 1.2, 0.9), (16, 0.9, 0.8))
    ]
    out = vf.summary(cells)["crossover"]["ngram alpha=0.7 k=4"]
    assert (out["engine"], out["rows"], out["batches"]) == (16, 4, [1, 4, 16])


def test_the_drafters_fixed_cost_is_the_intercept_of_its_proposal_time_against_k(tmp_path):
    """Proposals costing 0.3 ms + k x 1.1 ms at batch 1 and 0.9 + k x 1.3 at 64: the fixed part
    is found per batch and interpolated in log2(batch); another drafter's file is ignored."""
    import json

    from experiments.spec_crossover import DRAFTER, draft_fixed_s

    def rows(fixed, step, b):
        return [{"batch": b, "k": k, "paged_ms_per_position": (fixed + k * step) / k}
                for k in (1, 2, 4, 8)]  # fmt: skip

    run = {"args": {"drafter": DRAFTER}, "draft_cost": rows(0.3, 1.1, 1) + rows(0.9, 1.3, 64)}
    (tmp_path / "a.json").write_text(json.dumps(run))
    other = {"args": {"drafter": "draft:other"}, "draft_cost": rows(50.0, 1.0, 1)}
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert draft_fixed_s(1, tmp_path) == pytest.approx(0.3e-3)
    assert draft_fixed_s(64, tmp_path) == pytest.approx(0.9e-3)
    assert draft_fixed_s(8, tmp_path) == pytest.approx(0.6e-3)  # half way in log2
    assert draft_fixed_s(256, tmp_path) == pytest.approx(0.9e-3)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert draft_fixed_s(4, empty) == 0.0  # nothing measured: no fixed cost


def test_the_draft_heads_cost_is_its_proposal_times_slope_and_intercept(tmp_path):
    """eagle3 has no cost model: per position the slope of its proposal time against k, per
    proposal the intercept, per batch, interpolated in log2(batch); the 0.5B's rows are not
    read for it, and without rows of its own it is an error naming it."""
    import json

    from experiments.spec_crossover import DRAFTER, HEAD_DRAFTER, _draft_cost

    def rows(fixed, step, b, ks=(1, 2, 8)):
        return [{"batch": b, "k": k, "paged_ms_per_position": (fixed + k * step) / k} for k in ks]

    head = {
        "args": {"drafter": HEAD_DRAFTER},
        "draft_cost": rows(0.35, 0.28, 1) + rows(1.3, 0.32, 64),
    }
    (tmp_path / "h.json").write_text(json.dumps(head))
    (tmp_path / "d.json").write_text(
        json.dumps({"args": {"drafter": DRAFTER}, "draft_cost": rows(9, 9, 1)})
    )
    c1, c8 = _draft_cost("eagle3", 1, None, tmp_path), _draft_cost("eagle3", 8, None, tmp_path)
    assert (c1.per_position_s, c1.per_step_s) == (pytest.approx(0.28e-3), pytest.approx(0.35e-3))
    assert (c8.per_position_s, c8.per_step_s) == (pytest.approx(0.30e-3), pytest.approx(0.825e-3))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="eagle3"):
        _draft_cost("eagle3", 1, None, empty)
