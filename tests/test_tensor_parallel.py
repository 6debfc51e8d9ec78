"""Tensor parallelism of the decoder on the CPU: TP=2 with gloo in two spawned processes gives
the same greedy tokens as TP=1 (fp32), densely and through the engine's paged KV cache
(offline, and online with rank 0's plans broadcast to rank 1, preemptions included), with the
KV head replicated (1 KV head, 2 ranks) and split (2 KV heads); the split's layout and its
errors; the plan broadcast's table deltas."""

from __future__ import annotations

import pytest

from executor.model.testing import tiny_config
from executor.tensor_parallel import check, layout


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_tp2_greedy_tokens_equal_tp1(kv_heads):
    r = check(2, {"num_key_value_heads": kv_heads}, n=16)
    assert r["ranks"] == [r["reference"]] * 2
    assert r["max_logit_diff"] < 1e-4  # fp32: the all-reduce changes only the summation order
    outputs, steps = r["engine_reference"]
    assert outputs[0] == r["reference"][:10]  # the engine's request 0 is the dense prompt
    assert r["engine_ranks"] == [(outputs, steps)] * 2
    # online: rank 0 schedules and broadcasts; rank 1 follows; both ranks' tokens are TP=1's
    (out0, steps0, pre0), (out1, steps1, pre1) = r["online_ranks"]
    assert out0 == out1 == outputs and steps1 == steps0 and pre1 == pre0


def test_layout_splits_heads_and_replicates_a_shared_kv_head():
    cfg = tiny_config()  # 4 query heads, 1 KV head, intermediate 160
    a, b = layout(cfg, 0, 2), layout(cfg, 1, 2)
    assert (a.q_heads, b.q_heads) == (range(0, 2), range(2, 4))
    assert a.kv_heads == b.kv_heads == range(0, 1)
    assert (a.mlp_rows, b.mlp_rows) == (range(0, 80), range(80, 160))
    split = layout(tiny_config(num_key_value_heads=2), 1, 2)
    assert split.kv_heads == range(1, 2)


@pytest.mark.parametrize(
    "overrides,world,field",
    [({}, 3, "num_heads"), ({"intermediate_size": 150}, 4, "intermediate_size"),
     ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, "num_kv_heads"),
     ({}, 8, "num_heads")],
)  # fmt: skip
def test_a_split_that_does_not_divide_names_the_dimension(overrides, world, field):
    with pytest.raises(ValueError, match=field):
        layout(tiny_config(**overrides), 0, world)
