"""docs/cluster.md's own-router example runs as written; the study summary and the fidelity
case names parse as documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_own_router_example_runs_and_spreads_the_requests():
    text = (REPO / "docs" / "cluster.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(code.strip().splitlines()) <= 25
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    total, per = proc.stdout.strip().split(" ", 1)
    counts = [int(x) for x in per.strip("[]").split(",")]
    assert int(total) == 2000 == sum(counts) and min(counts) > 300


def test_rate_at_interpolates_and_flags_censored_grids():
    from experiments.cluster_summary import rate_at

    assert rate_at([10, 20, 30], [1.0, 0.95, 0.85]) == (pytest.approx(25.0), "")
    assert rate_at([10, 20], [0.5, 0.4]) == (10, "below")
    assert rate_at([10, 20], [1.0, 0.99]) == (20, "above")


def test_fidelity_case_names_round_trip():
    from experiments.cluster_fidelity import CaseKey, case_keys, parse_case

    for key in case_keys(4):
        assert parse_case(4, key.name) == key
    assert parse_case(2, "shared_prefix_30_round_robin_rep") == CaseKey(
        2, "shared_prefix", 30.0, "round_robin", True
    )
    with pytest.raises(ValueError, match="not <workload>"):
        parse_case(2, "nonsense")
    alone = case_keys(1)  # one replica alone: one router, each workload's middle load twice
    assert {k.router for k in alone} == {"round_robin"} and sum(k.repeat for k in alone) == 2
    assert all(parse_case(1, k.name) == k for k in alone)


def test_the_round_robin_variant_chooses_its_slice_without_the_judged_load():
    from experiments.cluster_quantum import SIDE, choose_slices

    def summarize(rows, side):  # noqa: ANN001, ANN202 - within 2 points, and the mean error
        errs = [abs(r[side]["goodput"] - r["engine"]["goodput"]) * 100 for r in rows]
        return {"cases_within_band": sum(e <= 2 for e in errs), "mean_abs_error_pts": sum(errs)}

    folds = [0, 1] + [2] * 5  # load 2's five cases are right at 1 ms only, loads 0 and 1 at 0.1
    rows = [{"engine": {"goodput": 0.5}, "fold": f} for f in folds]
    grid = {
        0.1: [{"goodput": 0.5 if f < 2 else 0.8} for f in folds],
        1.0: [{"goodput": 0.5 if f == 2 else 0.8} for f in folds],
    }
    chosen = choose_slices(rows, grid, lambda r: r["fold"], summarize)
    # in sample 1 ms is right on 5 of 7; held out, load 2 is judged at what loads 0 and 1 chose
    assert chosen == {0: 1.0, 1: 1.0, 2: 0.1}
    assert SIDE not in rows[0]  # the rows are not changed
