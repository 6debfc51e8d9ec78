"""Bad input gets a clear error naming the field, or a counted, reported rejection."""

from __future__ import annotations

import math

import pytest
from sched_driver import ConstantCost, drive

from horizon.model_shape import ModelShape, model_shape
from horizon.policies import make_policy
from horizon.request import SLO, Request
from horizon.scheduler import REJECT_KV_POOL, REJECT_MAX_MODEL_LEN, Scheduler
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation, gpu_spec, make_cost_model


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(arrival_time=-1.0), "arrival_time"),
        (dict(arrival_time=math.nan), "arrival_time"),
        (dict(arrival_time=math.inf), "arrival_time"),
        (dict(num_prompt_tokens=0), "num_prompt_tokens"),
        (dict(max_output_tokens=0), "max_output_tokens"),
        (dict(true_output_tokens=0), "true_output_tokens"),  # a zero-length output
        (dict(true_output_tokens=9), "true_output_tokens"),  # above max_output_tokens
        (dict(prompt_token_ids=(1, 2)), "prompt_token_ids"),
    ],
)
def test_bad_request_fields_are_named(kwargs, field):
    base = dict(
        request_id=3,
        arrival_time=0.0,
        num_prompt_tokens=4,
        max_output_tokens=8,
        true_output_tokens=5,
    )
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        Request(**base)


@pytest.mark.parametrize(
    "ttft,itl,field", [(0, 1, "ttft"), (1, -1, "itl"), (math.nan, 1, "ttft"), (1, math.inf, "itl")]
)
def test_impossible_slo_values_are_named(ttft, itl, field):
    with pytest.raises(ValueError, match=f"SLO.{field}"):
        SLO(ttft, itl)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(num_blocks=0), "num_blocks"),
        (dict(num_blocks=10, block_size=0), "block_size"),
        (dict(num_blocks=10, max_num_batched_tokens=0), "max_num_batched_tokens"),
        (dict(num_blocks=10, max_num_seqs=64, max_num_batched_tokens=32), "max_num_batched_tokens"),
        (dict(num_blocks=10, max_model_len=-5), "max_model_len"),
        (dict(num_blocks=10, step_mode="fast"), "step_mode"),
        (dict(num_blocks=2.5), "num_blocks"),
    ],
)
def test_impossible_budget_values_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown policy 'lifo'.*fcfs.*memory_first"):
        make_policy("lifo")
    with pytest.raises(ValueError, match="bad options for policy 'fcfs'"):
        make_policy("fcfs", aging=3)
    with pytest.raises(ValueError, match="unknown model shape 'gpt-5'.*qwen2.5-7b"):
        model_shape("gpt-5")
    with pytest.raises(ValueError, match="unknown GPU 'TPU'.*H200"):
        gpu_spec("TPU")
    with pytest.raises(ValueError, match="unknown cost model 'exact'.*roofline"):
        make_cost_model("exact")
    with pytest.raises(ValueError, match="sjf_prompt.aging_tokens_per_s"):
        make_policy("sjf_prompt", aging_tokens_per_s=-1.0)


def test_model_config_missing_field_is_named():
    with pytest.raises(ValueError, match="lacks field 'num_attention_heads'"):
        ModelShape.from_hf_config("x", {"hidden_size": 8})


def test_requests_that_can_never_run_are_rejected_counted_and_reported():
    cfg = SchedulerConfig(
        num_blocks=8, block_size=4, max_model_len=40, max_num_seqs=4, max_num_batched_tokens=16
    )
    reqs = [
        Request(0, 0.0, 10, 8, 5),  # fits
        Request(1, 0.0, 30, 20, 5),  # prompt + max output > max_model_len
        Request(2, 0.0, 20, 20, 5),  # fits max_model_len (40) but not the pool (32 tokens)
        Request(3, 0.1, 6, 4, 4),  # fits
    ]
    sched, rec, _ = drive(reqs, cfg, "fcfs")
    assert list(rec.status) == [0, 1, 1, 0]
    assert rec.reject_reason == ["", REJECT_MAX_MODEL_LEN, REJECT_KV_POOL, ""]
    assert list(rec.num_output_tokens) == [5, 0, 0, 4]


def test_rejections_are_in_the_next_plan():
    sched = Scheduler(SchedulerConfig(num_blocks=2, block_size=4), make_policy("fcfs"))
    bad = Request(0, 0.0, 30, 10, 5)
    sched.add(bad)
    plan = sched.schedule(0.0)
    assert plan.rejected == ((bad, REJECT_KV_POOL),)
    with pytest.raises(ValueError, match="already scheduled"):
        sched.add(bad)


def test_a_request_object_is_single_use():
    cfg = SchedulerConfig(num_blocks=16, block_size=4)
    reqs = [Request(0, 0.0, 5, 4, 3)]
    Simulation(reqs, cfg, make_policy("fcfs"), ConstantCost()).run()
    with pytest.raises(ValueError, match="already scheduled"):
        Simulation(reqs, cfg, make_policy("fcfs"), ConstantCost()).run()


def test_bad_max_time_is_named():
    with pytest.raises(ValueError, match="max_time"):
        Simulation(
            [], SchedulerConfig(num_blocks=4), make_policy("fcfs"), ConstantCost(), max_time=-1.0
        )
