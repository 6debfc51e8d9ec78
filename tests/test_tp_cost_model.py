"""The tensor-parallel cost model (simulator/tp_cost_model.py, simulator/tp_fit.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from horizon.model_shape import model_shape
from simulator import gpu_spec, make_cost_model
from simulator.cost_model import RooflineCostModel
from simulator.kv_link import link_spec
from simulator.tp_cost_model import COEFFICIENTS, TensorParallelCostModel, ring_factor
from simulator.tp_fit import with_world

Q7B = model_shape("qwen2.5-7b")
H200 = gpu_spec("H200")
SHAPES = [(0, 1, 900, 0, 0, 0), (0, 64, 64 * 1500, 0, 0, 0), (512, 8, 4000, 300, 200_000, 2)]


def test_world_one_prices_every_step_as_the_roofline():
    tp = TensorParallelCostModel(Q7B, H200, world=1, overhead_s=0.0007)
    base = RooflineCostModel(Q7B, H200, overhead_s=0.0007)
    for s in [*SHAPES, (0, 0, 0, 0, 0, 0), (2048, 0, 0, 0, 2048 * 1024, 1)]:
        assert tp.time_for(*s) == base.time_for(*s)
    assert tp.num_all_reduces == 0 and tp.all_reduce_bytes_s(100) == 0.0


def test_rank_weight_bytes_of_the_7b_at_tp2_are_its_split_plus_the_replicated_parts():
    s, w = Q7B, 2
    h, d = s.hidden_size, s.head_dim
    q, kv = s.num_heads // w * d, s.num_kv_heads // w * d
    split_layer = h * (q + 2 * kv) + q * h + (q + 2 * kv) + 3 * h * (s.intermediate_size // w)
    norms = 2 * h
    replicated = 2 * s.vocab_size * h + h  # embedding, LM head (untied), final norm
    expected = 2 * (s.num_layers * (split_layer + norms) + replicated)
    model = TensorParallelCostModel(Q7B, H200, world=w)
    assert model.rank_weight_bytes == expected
    assert s.weight_bytes() / 2 < expected < s.weight_bytes()
    assert model.weight_read_s == expected / H200.mem_bandwidth


def test_kv_heads_fewer_than_ranks_are_replicated():
    s = model_shape("qwen2.5-0.5b")  # 14 heads, 2 KV heads: world 2 splits them, 7 would not
    at2 = TensorParallelCostModel(s, H200, world=2)._rank.shape
    assert at2.num_kv_heads == 1 and at2.num_heads == 7
    llama = model_shape("llama-3-8b")  # 32 heads, 8 KV heads
    rep = dataclasses.replace(llama, num_kv_heads=2, name="llama-kv2")
    at8 = TensorParallelCostModel(rep, H200, world=8)._rank.shape
    assert at8.num_kv_heads == 1 and at8.num_heads == 4
    assert at8.kv_bytes_per_token() == rep.kv_bytes_per_token() // 2


def test_all_reduce_bytes_time_scales_as_the_ring_factor():
    tokens = 64
    one = 2 * Q7B.num_layers * tokens * Q7B.hidden_size * 2 / link_spec("nvlink").bandwidth
    for w in (2, 4):
        m = TensorParallelCostModel(Q7B, H200, world=w)
        assert m.all_reduce_bytes_s(tokens) == pytest.approx(one * 2 * (w - 1) / w, rel=1e-12)
        assert m.all_reduce_bytes_s(2 * tokens) == pytest.approx(2 * m.all_reduce_bytes_s(tokens))
    two, four = (TensorParallelCostModel(Q7B, H200, world=w).all_reduce_bytes_s(10) for w in (2, 4))
    assert four / two == pytest.approx(ring_factor(4) / ring_factor(2)) == pytest.approx(1.5)
    lat = TensorParallelCostModel(Q7B, H200, world=4, allreduce_launch_s=5e-6, allreduce_hop_s=2e-6)
    assert lat.all_reduce_latency_s() == pytest.approx(56 * (5e-6 + 6 * 2e-6))


def test_batch1_decode_of_the_7b_at_tp2_costs_between_half_and_all_of_tp1():
    one = TensorParallelCostModel(Q7B, H200, world=1).time_for(0, 1, 1024, 0, 0, 0)
    two = TensorParallelCostModel(Q7B, H200, world=2).time_for(0, 1, 1024, 0, 0, 0)
    assert one / 2 < two < one


def test_registered_by_name_and_by_import_path():
    by_name = make_cost_model("tensor_parallel", shape=Q7B, gpu=H200, world=2, link="pcie5")
    assert isinstance(by_name, TensorParallelCostModel) and by_name.link == link_spec("pcie5")
    by_path = make_cost_model(
        "simulator.tp_cost_model:TensorParallelCostModel", shape=Q7B, gpu=H200, world=2
    )
    assert by_path.link == link_spec("nvlink")
    assert by_name.time_for(*SHAPES[1]) > by_path.time_for(*SHAPES[1])  # the slower link


@pytest.mark.parametrize(
    ("world", "field"),
    [(3, "num_heads"), (8, "num_heads"), (0, "world"), (2.0, "world")],
)
def test_a_world_that_does_not_split_the_shape_raises_naming_it(world, field):
    with pytest.raises(ValueError, match=r"^TensorParallelCostModel\.world ") as e:
        TensorParallelCostModel(Q7B, H200, world=world)
    assert "\n" not in str(e.value) and f"{field} " in str(e.value)


def test_a_world_that_does_not_split_the_kv_heads_raises():
    shape = dataclasses.replace(model_shape("llama-3-8b"), num_kv_heads=4, name="kv4")
    TensorParallelCostModel(shape, H200, world=8)  # 8 = 2 x 4: each KV head on two ranks
    odd = dataclasses.replace(shape, num_heads=24, num_kv_heads=6, name="kv6")
    with pytest.raises(ValueError, match="world 4 does not split kv6's num_kv_heads 6"):
        TensorParallelCostModel(odd, H200, world=4)


def test_bad_coefficients_and_links_raise_naming_the_field():
    with pytest.raises(ValueError, match="TensorParallelCostModel.bytes_scale"):
        TensorParallelCostModel(Q7B, H200, world=2, bytes_scale=-1.0)
    with pytest.raises(ValueError, match="unknown link 'ethernet'"):
        TensorParallelCostModel(Q7B, H200, world=2, link="ethernet")


def _synthetic(coef: dict, worlds: tuple[int, ...], n: int, seed: int, noise: float = 0.0):
    rng = np.random.default_rng(seed)
    rows = []
    for w in worlds:
        model = TensorParallelCostModel(Q7B, H200, world=w, **coef)
        for _ in range(n):
            d = int(rng.integers(0, 128))
            p = int(rng.choice([0, 0, rng.integers(1, 2048)]))
            d = max(d, 1) if p == 0 else d
            shape = (p, d, d * int(rng.integers(10, 3000)), p // 2, p * p // 2, int(p > 0))
            t = model.time_for(*shape) * (1 + noise * rng.standard_normal())
            rows.append(with_world(np.array([[*shape, 0, 0, 0, t]], dtype=float), w)[0])
    return np.array(rows)


def test_fit_recovers_known_coefficients_from_synthetic_steps():
    coef = {"rank_scale": 1.3, "latency_scale": 1.7, "bytes_scale": 1.25, "overhead_s": 0.0008}
    rows = _synthetic(coef, (1, 2, 4), 80, seed=1)
    fitted = TensorParallelCostModel.fit(rows, Q7B, H200)
    assert fitted.world == 4
    for name in COEFFICIENTS:
        assert fitted.coefficients()[name] == pytest.approx(coef[name], rel=1e-6)
    noisy = TensorParallelCostModel.fit(_synthetic(coef, (1, 2), 200, 2, 0.02), Q7B, H200, 2)
    assert noisy.world == 2
    for name in COEFFICIENTS:
        assert noisy.coefficients()[name] == pytest.approx(coef[name], rel=0.1)
    assert all(v >= 0 for v in noisy.coefficients().values())


def test_fit_refuses_steps_of_one_world_size():
    rows = _synthetic({}, (2,), 30, seed=3)
    with pytest.raises(ValueError, match=r">= 2 world sizes .* got \[2\]"):
        TensorParallelCostModel.fit(rows, Q7B, H200)
    with pytest.raises(ValueError, match="rows must have the 11 TP_STEP_COLUMNS"):
        TensorParallelCostModel.fit(rows[:, 1:], Q7B, H200)
