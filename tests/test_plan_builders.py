"""``new_plan`` / ``new_result`` build the same frozen objects as ``StepPlan(...)`` /
``StepResult(...)`` (the scheduler and the simulator's backend use them every step)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from horizon.plan import StepPlan, StepResult, new_plan, new_result
from horizon.request import Request


def _fields(obj: object) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def test_new_plan_is_the_frozen_step_plan_its_constructor_makes():
    r = Request(3, 0.0, 10, 5, 5)
    args = (7, 1.5, (r,), ((r, 4),), (), ((r, "x"),), 4, 10, 30, 14, 1, 2, 3, 256, 0)
    for extra in ((), (((r, 2),),), ((), 10)):
        p, q = new_plan(*args, *extra), StepPlan(*args, *extra)
        assert type(p) is StepPlan and _fields(p) == _fields(q)
        assert p.num_tokens == q.num_tokens and p.is_empty == q.is_empty
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.step = 8  # type: ignore[misc]
        assert dataclasses.replace(p, step=8).step == 8 and p.step == 7
        assert repr(p) == repr(q)
        assert _fields(pickle.loads(pickle.dumps(p))).keys() == _fields(q).keys()
    assert new_plan(*args).verifies == ()


def test_new_result_is_the_frozen_step_result_with_a_fresh_token_dict():
    r = Request(3, 0.0, 10, 5, 5)
    a, b = new_result(0.25, (r,)), StepResult(0.25, (r,))
    assert type(a) is StepResult and _fields(a) == _fields(b)
    assert new_result(0.1).token_ids is not new_result(0.1).token_ids
    assert new_result(0.1, (), (1, 0)).accepted == (1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.duration = 1.0  # type: ignore[misc]
