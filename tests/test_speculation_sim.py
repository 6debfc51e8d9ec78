"""Speculative decoding in the simulator: the stated acceptance model, verification priced as
decode rows or prefill chunks, drafting costs, and records unchanged with speculation off."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from sched_driver import random_requests

from horizon.acceptance import AcceptanceModel
from horizon.model_shape import model_shape
from horizon.plan import StepPlan
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from horizon.speculation import SpeculationConfig, expected_tokens
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.engine_cost_model import Buckets, EngineCostModel
from simulator.verification_cost import (
    DraftCost,
    SpeculativeCostModel,
    VerifyCost,
    as_decode_rows,
    as_prefill_chunks,
)

SHAPE, GPU = model_shape("qwen2.5-7b"), gpu_spec("H200")
ROOF = make_cost_model("roofline", shape=SHAPE, gpu=GPU)
CALIBRATION = "calibration/h200_qwen2.5-7b_online.csv.gz"
BEFORE_LONGEST = Path(__file__).parent / "data" / "h200_qwen2.5-7b_online.before_longest.fit.json"

# Digests of these runs' records at the commit before speculation existed (556e218): with
# speculation off, the records must stay byte-identical.
GOLDEN = {
    ("event", "fcfs", "roofline", False): (
        "0a50815a5d567a0eec53b4a35bcfaa11c8b588647114b3d7a58a00d9db0f79e9"
    ),
    ("event", "fcfs", "engine_fitted", True): (
        "7c27b1a73df23326f6d058b44b9e760a3a28c3d31f3ee10e385bd2ebd02c196a"
    ),
    ("event", "vllm", "engine_fitted", False): (
        "21fdfef00dff499dd4164caad65e8a774ed8d34c74c6e517a2310edb95ca8243"
    ),
    ("reference", "memory_first", "roofline", False): (
        "ec8da852c85f31de8e7eff215cfece500025217d14db40baf993c064e3499837"
    ),
}


def _cost(name: str):  # noqa: ANN202
    if name == "roofline":
        return ROOF
    return make_cost_model(name, shape=SHAPE, gpu=GPU, path=CALIBRATION)


def _before_longest() -> EngineCostModel:
    """The engine-fitted model as it was fitted before the longest decode's term existed (its
    12 mixed coefficients, kept in tests/data): the golden digests predate the term."""
    doc = json.loads(BEFORE_LONGEST.read_text())
    return EngineCostModel(
        tuple(doc["decode_coef"]), tuple(doc["mixed_coef"]), Buckets(**doc["buckets"]), doc["knee"]
    )


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_speculation_off_records_are_byte_identical_to_before(key):
    mode, policy, cost, pipelined = key
    reqs = random_requests(random.Random(7), 300, 400, 300, rate=30)
    cfg = SchedulerConfig(
        num_blocks=400, block_size=16, max_num_batched_tokens=256, max_num_seqs=64, step_mode=mode
    )
    rec = Simulation(
        reqs,
        cfg,
        make_policy(policy),
        ROOF if cost == "roofline" else _before_longest(),
        pipelined=pipelined,
        arrivals_at_step_boundaries=pipelined,
    ).run()
    assert rec.digest() == GOLDEN[key]


def _one_request(spec: SpeculationConfig | None, alpha: float, cost=ROOF, n_out=2001):  # noqa: ANN001
    r = Request(0, 0.0, 512, n_out, n_out, prompt_token_ids=tuple(range(512)))
    cfg = SchedulerConfig(num_blocks=2000, speculation=spec)
    sim = Simulation(
        [r],
        cfg,
        make_policy("fcfs"),
        cost,
        acceptance=AcceptanceModel.geometric(alpha, 1),
        check_every=1,
    )
    rec = sim.run()
    decode_steps = len(rec.step_end) - 1  # after the prefill's step
    step_s = float(np.mean(np.diff(rec.step_end)))
    return (n_out - 1) / decode_steps, step_s, rec


@pytest.mark.parametrize("cost", ["roofline", "engine_fitted"])
def test_alpha_09_k4_at_batch_1_emits_1_plus_sum_alpha_i_per_step_and_costs_more(cost):
    model = _cost(cost)
    plain_tps, plain_s, _ = _one_request(None, 0.9, model)
    spec_tps, spec_s, rec = _one_request(SpeculationConfig(num_draft_tokens=4), 0.9, model)
    assert plain_tps == 1.0
    want = expected_tokens(0.9, 4)  # 1 + 0.9 + 0.81 + 0.729 + 0.6561 = 4.095
    assert want == pytest.approx(4.0951)
    assert spec_tps == pytest.approx(want, rel=0.05)
    assert spec_s > plain_s  # a verification step costs more than a decode step
    assert spec_s / spec_tps < plain_s  # but less per token at batch 1
    rec.check()


def test_acceptance_model_matches_its_stated_rates_and_is_common_random_numbers():
    m = AcceptanceModel((0.9, 0.5), seed=4)
    assert m.survival(3) == pytest.approx([0.9, 0.45, 0.225])
    reqs = [Request(i, 0.0, 4, 100, 100) for i in range(20000)]
    a3 = m.sample([(r, 3) for r in reqs])
    assert a3.mean() == pytest.approx(m.expected_tokens(3) - 1, rel=0.03)
    a1 = m.sample([(r, 1) for r in reqs])
    assert np.all(a1 == np.minimum(a3, 1))  # a larger k never accepts fewer drafts
    assert np.array_equal(m.sample([(r, 3) for r in reversed(reqs)]), a3[::-1])  # no order
    other = AcceptanceModel((0.9, 0.5), seed=5).sample([(r, 3) for r in reqs])
    assert not np.array_equal(other, a3)
    assert AcceptanceModel.geometric(0.0).sample([(reqs[0], 5)]).tolist() == [0]
    assert AcceptanceModel.geometric(1.0).sample([(reqs[0], 5)]).tolist() == [5]
    with pytest.raises(ValueError, match="AcceptanceModel.rates"):
        AcceptanceModel((1.5,))


def _verify_plan() -> StepPlan:
    r = Request(0, 0.0, 100, 50, 50)
    r.advance(100)  # prefilled: C = 100, one token out
    d = Request(1, 0.0, 10, 50, 50)
    d.advance(10)
    return StepPlan(
        step=3, time=0.0, decodes=(d,), prefills=(), decode_context_tokens=10, verifies=((r, 4),)
    )


def test_verification_is_priced_as_a_prefill_chunk_over_its_context():
    plan = _verify_plan()
    assert plan.num_verify_tokens == 5 and plan.num_tokens == 6
    assert plan.verify_context_tokens == 105
    assert plan.verify_attention_pairs == 5 * 100 + 15
    chunks = as_prefill_chunks(plan)
    assert chunks.verifies == () and len(chunks.prefills) == 1 and chunks.prefills[0][1] == 5
    assert (chunks.num_prefill_tokens, chunks.prefill_context_tokens) == (5, 105)
    assert chunks.prefill_attention_pairs == 515
    priced = SpeculativeCostModel(ROOF, verify=VerifyCost("prefill_chunks"))
    assert priced.step_time(plan) == ROOF.step_time(chunks)
    plain = StepPlan(step=0, time=0.0, decodes=plan.decodes, prefills=(), decode_context_tokens=10)
    assert priced.step_time(plain) == ROOF.step_time(plain)
    drafted = SpeculativeCostModel(
        ROOF,
        DraftCost("model", per_token_s=1e-4, per_position_s=1e-3),
        VerifyCost("prefill_chunks"),
    )
    assert drafted.step_time(plan) == pytest.approx(ROOF.step_time(chunks) + 4e-4 + 4e-3)
    fixed = DraftCost("model", per_position_s=1e-3, per_step_s=5e-4)
    assert fixed.step_time(plan) == pytest.approx(5e-4 + 4e-3)
    assert fixed.step_time(plain) == 0.0
    with pytest.raises(ValueError, match="DraftCost.drafter"):
        DraftCost("eagle")
    with pytest.raises(ValueError, match="DraftCost.per_step_s"):
        DraftCost("model", per_step_s=-1.0)


def test_verification_as_decode_rows_reads_each_rows_context():
    """The default shape: a verify of k drafts at C computed tokens is k + 1 decode rows over
    C, C + 1, ..., C + k tokens; the host terms add per step and per verifying request."""
    plan = _verify_plan()
    rows = as_decode_rows(plan)
    assert rows.verifies == () and rows.prefills == ()
    assert len(rows.decodes) == 1 + 5
    assert rows.decode_context_tokens == 10 + sum(100 + i for i in range(5))
    priced = SpeculativeCostModel(ROOF)  # decode_rows is the default
    assert priced.step_time(plan) == ROOF.step_time(rows)
    hosted = SpeculativeCostModel(ROOF, verify=VerifyCost(per_step_s=1e-3, per_verify_s=2e-4))
    assert hosted.step_time(plan) == pytest.approx(ROOF.step_time(rows) + 1e-3 + 2e-4)
    plain = StepPlan(step=0, time=0.0, decodes=plan.decodes, prefills=(), decode_context_tokens=10)
    assert hosted.step_time(plain) == ROOF.step_time(plain)  # no verifies: no host terms
    with pytest.raises(ValueError, match="VerifyCost.shape"):
        VerifyCost("tree")
    with pytest.raises(ValueError, match="VerifyCost.per_verify_s"):
        VerifyCost(per_verify_s=-1e-3)


def test_a_step_with_chunks_or_past_the_largest_decode_graph_takes_the_mixed_path():
    """Chunks in the step (the engine's mixed path), or more rows than the cost model's
    decode graphs cover (no decode price there), price the verifies as chunks."""
    cost = _cost("engine_fitted")
    spec = SpeculativeCostModel(cost)
    plan = _verify_plan()
    assert spec.shaped(plan).decodes == as_decode_rows(plan).decodes
    p = Request(5, 0.0, 64, 4, 4)
    mixed = StepPlan(
        step=3,
        time=0.0,
        decodes=plan.decodes,
        prefills=((p, 64),),
        num_prefill_tokens=64,
        decode_context_tokens=10,
        prefill_context_tokens=64,
        prefill_attention_pairs=64 * 65 // 2,
        verifies=plan.verifies,
    )
    assert spec.step_time(mixed) == cost.step_time(as_prefill_chunks(mixed))
    many = tuple(Request(10 + i, 0.0, 50, 4, 4) for i in range(cost.max_num_seqs // 4))
    for r in many:
        r.advance(50)
    wide = StepPlan(step=3, time=0.0, decodes=(), prefills=(), verifies=tuple((r, 4) for r in many))
    assert wide.num_verify_tokens > cost.max_num_seqs
    assert spec.step_time(wide) == cost.step_time(as_prefill_chunks(wide))
    narrow = StepPlan(step=3, time=0.0, decodes=(), prefills=(), verifies=wide.verifies[:8])
    assert spec.step_time(narrow) == cost.step_time(as_decode_rows(narrow))


def test_a_simulation_with_speculation_needs_an_acceptance_model():
    cfg = SchedulerConfig(num_blocks=100, speculation=SpeculationConfig())
    with pytest.raises(ValueError, match="Simulation.acceptance"):
        Simulation([], cfg, make_policy("fcfs"), ROOF)


def test_the_engine_loop_runs_speculation_and_batch_limited_turns_it_off_under_load():
    """Pipelined, arrivals between steps, engine-fitted costs: batch_limited speculates only
    while few requests decode, and every request still ends with its true length."""
    reqs = random_requests(random.Random(2), 200, 300, 200, rate=40)
    spec = SpeculationConfig(policy="batch_limited", num_draft_tokens=4, max_batch=8)
    cfg = SchedulerConfig(num_blocks=2000, max_num_seqs=64, speculation=spec)
    sim = Simulation(
        reqs,
        cfg,
        make_policy("fcfs"),
        _cost("engine_fitted"),
        acceptance=AcceptanceModel.geometric(0.7, 3),
        check_every=1,
        pipelined=True,
        arrivals_at_step_boundaries=True,
        draft_cost=DraftCost("model", per_token_s=2e-5),
    )
    rec = sim.run()
    assert np.array_equal(rec.num_output_tokens, rec.true_output_tokens)
    s = sim.scheduler
    assert 0 < s.num_accepted < s.num_drafted
    assert rec.decode_tokens.max() > 8  # above max_batch it decoded plainly
