"""Variant (d) of the cluster fidelity comparison: drawn slice counts on the time-sliced device
(``simulator.device_sharing.SliceCounts``), the co-located own-part cost model
(``simulator.colocated_cost_model``) and its fit (``experiments.colocated_fit``)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from experiments.cluster_fidelity import COLOCATED_SIDES, CaseKey, colocated_fold
from experiments.colocated_fit import FOLDS, fit_own, fold_mask, label_counts
from horizon.plan import StepPlan
from simulator.colocated_cost_model import FIT_FILE, ColocatedCostModel
from simulator.device_sharing import DeviceSpec, SliceCounts, TimeSlices
from simulator.engine_cost_model import Buckets, EngineCostModel
from simulator.shared_device import SharedDevice

# under 2 ms: always one slice; from 2 ms: one or two, evenly; from 4 ms: always three
COUNTS = SliceCounts((0.002, 0.004), ((1.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.0, 0.0, 1.0)), seed=3)


def _plan(prefill: int = 0, decodes: int = 1) -> StepPlan:
    return StepPlan(0, 0.0, (None,) * decodes, (), num_prefill_tokens=prefill)  # type: ignore[arg-type]


def test_counts_follow_the_bin_of_the_own_time():
    rng = random.Random(0)
    assert {COUNTS.draw(_plan(prefill=64), 0.001, rng) for _ in range(200)} == {1}
    assert {COUNTS.draw(_plan(prefill=64), 0.005, rng) for _ in range(200)} == {3}
    mid = [COUNTS.draw(_plan(prefill=64), 0.003, rng) for _ in range(4000)]
    assert set(mid) == {1, 2} and abs(mid.count(2) / len(mid) - 0.5) < 0.03
    # decode-only steps are one graph, one slice, whatever their time
    assert {COUNTS.draw(_plan(decodes=8), 0.005, rng) for _ in range(50)} == {1}


def test_slice_counts_are_checked():
    with pytest.raises(ValueError, match="probs: 2 rows for 3 bins"):
        SliceCounts((0.002, 0.004), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match="distributions"):
        SliceCounts((0.002,), ((0.5, 0.4), (1.0,)))
    with pytest.raises(ValueError, match="SliceFit or SliceCounts"):
        DeviceSpec("gpu0", "timeslice", fit=(1.0,))  # type: ignore[arg-type]


def test_drawn_bookings_are_seeded_and_add_whole_slices():
    def ends(seed: int) -> list[float]:
        ts = TimeSlices(SliceCounts(COUNTS.edges_s, COUNTS.probs, seed))
        out = [ts.book(0.0, 0.001, _plan(), 0.0, "a")]  # a neighbour's 1 ms slice in flight
        out += [ts.book(0.0, 0.003, _plan(prefill=256), 0.0, f"b{i}") for i in range(40)]
        return out

    a = ends(1)
    assert a == ends(1)  # the same seed and bookings: the same ends
    assert a != ends(2)
    # each of b's steps: its 3 ms plus one or two of a's 1 ms slices (b's own earlier steps
    # are other owners too, so only the first is exact)
    assert a[1] == pytest.approx(0.004)
    assert all(e >= 0.004 - 1e-12 for e in a[1:])


def test_the_model_prices_every_fold_and_names_an_unknown_one():
    decode = replace(_plan(decodes=16), decode_context_tokens=16 * 500)
    plan = replace(
        decode,
        num_prefill_tokens=512,
        prefill_context_tokens=512,
        prefill_attention_pairs=512 * 513 // 2,
    )
    for fold in FOLDS:
        m = ColocatedCostModel(FIT_FILE, fold)
        assert 1e-4 < m.step_time(decode) < m.step_time(plan) < 0.05
        assert m.step_time(StepPlan(0, 0.0, (), ())) == 0.0
        dev = SharedDevice(m.device("gpu0", seed=0))
        d = m.step_time(plan)
        assert dev.reserve(0.0, d, plan, 0.0, "a") == pytest.approx(d)  # alone: its own part
    with pytest.raises(ValueError, match="fold 'nope'"):
        ColocatedCostModel(FIT_FILE, "nope")


def test_held_out_sides_never_use_the_fold_of_their_case():
    x = {
        "load_index": np.array([0, 1, 2, 0]),
        "sessions": np.array([True, True, False, False]),
        "dur": np.ones(4),
    }
    assert fold_mask(x, "without_load1").tolist() == [True, False, True, True]
    assert fold_mask(x, "without_sessions").tolist() == [False, False, True, True]
    key = CaseKey(4, "sessions", 18.0, "round_robin")
    folds = {side: colocated_fold(key, side) for side in COLOCATED_SIDES}
    assert folds == {
        "sim_colocated": "without_load1",
        "sim_colocated_other_workload": "without_sessions",
        "sim_colocated_in_sample": "all",
    }


def _synthetic_steps(truth: EngineCostModel, steps: int = 3000) -> dict:
    """Two replicas' overlapping steps whose times follow the rule exactly: own part by
    ``truth``, a mixed step of over 400 tokens 2 slices, every step one neighbour in flight."""
    rng = np.random.default_rng(0)
    # mixed steps at even places only: a neighbour is then decode-only, one slice (two mixed
    # neighbours of each other give only the ratio of their counts)
    prefill = np.where(rng.random(steps) < 0.6, rng.integers(16, 900, steps), 0)
    prefill[1::2] = 0
    decodes = rng.integers(1, 64, steps)
    ctx = decodes * rng.integers(100, 2000, steps)
    rows = np.zeros((steps, 9))
    rows[:, 0], rows[:, 1], rows[:, 2] = prefill, decodes, ctx
    rows[:, 3] = prefill * 2
    rows[:, 4] = prefill * prefill // 2
    rows[:, 5] = (prefill > 0).astype(float)
    own = truth.predict_rows(rows)
    n = np.where(prefill + decodes > 400, 2, 1) * (prefill > 0) + (prefill == 0)
    others = np.arange(steps) ^ 1  # pairs (0, 1), (2, 3), ...: each the other's neighbour
    dur = own + n * own[others] / n[others]
    rows[:, -1] = dur
    return {
        "rows": rows,
        "dur": dur,
        # the isolated model, 10% off: the counts start from it (a start off by a slice or
        # more can settle on counts one higher and own parts a slice lower, which fit too)
        "pred": 0.9 * own,
        "others": others[:, None],
        "n": np.full(steps, 2),
        "sessions": np.ones(steps, dtype=bool),
        "load_index": np.zeros(steps, dtype=int),
        "true_n": n,
    }


def test_the_joint_fit_recovers_an_own_part_and_its_slice_counts():
    b = Buckets(256, 2048)
    decode = tuple([4e-4 + 2e-6 * i for i in range(len(b.decode))] + [1e-6, 2e-9, 0.0, 0.0])
    mixed = (1e-3, 1e-6, 1e-6, 1e-10, 0.0, 2e-9, 1e-6, 1e-4, 0.0, 0.0, 0.0, 0.0)
    truth = EngineCostModel(decode, mixed, b)
    x = _synthetic_steps(truth)
    model, own, counts = fit_own(x, np.ones(len(x["dur"]), dtype=bool), rounds=3)
    truth_own = truth.predict_rows(x["rows"])
    assert np.median(np.abs(own / truth_own - 1)) < 0.02
    assert (counts == x["true_n"]).all()
    lab, _ = label_counts(x, truth_own, x["true_n"].astype(float))
    assert (lab == x["true_n"]).all()  # measured against the truth, every count is right
