"""The engine on the CPU (tiny model, torch reference attention): greedy outputs equal a plain
dense decode through chunked prefill, mixed steps, preemption and prefix-cache hits; records are
the simulator's."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from executor.engine import Engine, EngineConfig
from executor.model import CausalLM
from executor.model.testing import greedy_decode, tiny_config
from executor.sampling import SamplingParams
from executor.weights import random_weights
from horizon.request import Request

PROMPT_LENS = [5, 17, 33, 9, 40, 2, 26, 12]
OUTPUT_LENS = [7, 12, 3, 9, 15, 1, 6, 10]
MAX_OUTPUT = 16


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on a shared CPU run far faster on one thread than fighting over several."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_model(**overrides) -> CausalLM:
    model = CausalLM(tiny_config(**overrides))
    random_weights(model, 7, std=0.2)  # peaked logits: greedy tokens are far from ties
    return model


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model()


def make_prompts(lengths=PROMPT_LENS, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]


PROMPTS = make_prompts()


def make_requests(prompts=PROMPTS, outputs=OUTPUT_LENS, arrivals=None) -> list[Request]:
    arrivals = arrivals or [0.0] * len(prompts)
    return [
        Request(i, t, len(p), MAX_OUTPUT, o, prompt_token_ids=tuple(p))
        for i, (p, o, t) in enumerate(zip(prompts, outputs, arrivals))
    ]


def dense_greedy(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    """Greedy decode of one sequence with contiguous (non-paged) caches."""
    return greedy_decode(model, prompt, n)[0]


@pytest.fixture(scope="module")
def dense(model: CausalLM) -> dict[int, list[int]]:
    return {i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUT_LENS))}


def engine(model: CausalLM, **kw) -> Engine:
    cfg = {
        "num_blocks": 200,
        "block_size": 4,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 4,
        "max_model_len": 128,
    }
    cfg.update(kw)
    sampling = cfg.pop("sampling", None)
    return Engine(model, EngineConfig(**cfg), sampling=sampling)


@pytest.mark.parametrize("step_mode", ["event", "reference"])
def test_greedy_equals_dense_decode_through_chunks_and_mixed_steps(model, dense, step_mode):
    e = engine(model, step_mode=step_mode)
    rec = e.run_offline(make_requests())
    rec.check()
    assert e.outputs == dense
    mixed = (rec.prefill_tokens > 0) & (rec.decode_tokens > 0)
    assert mixed.sum() >= 3  # chunks and decodes shared steps
    assert rec.prefill_tokens.max() == 16 and max(PROMPT_LENS) > 16  # prompts were chunked
    assert (rec.num_output_tokens == OUTPUT_LENS).all()


def test_larger_budget_same_tokens(model, dense):
    e = engine(model, max_num_batched_tokens=128, max_num_seqs=8)
    e.run_offline(make_requests())
    assert e.outputs == dense


def test_preemption_then_recompute_regenerates_identical_tokens(model, dense):
    e = engine(model, num_blocks=16)  # 64 tokens of KV: the longest request alone needs 56
    rec = e.run_offline(make_requests())
    rec.check()
    assert rec.num_preemptions.sum() > 0 and rec.recomputed_tokens.sum() > 0
    assert (rec.status == 0).all()
    assert e.outputs == dense


def test_seeded_sampling_survives_preemption(model):
    """Counter-based sampling: a recomputed request draws the same tokens."""
    params = SamplingParams(temperature=1.0, top_k=50)
    roomy = engine(model, sampling=params)
    roomy.run_offline(make_requests())
    tight = engine(model, num_blocks=16, sampling=params)
    rec = tight.run_offline(make_requests())
    assert rec.num_preemptions.sum() > 0
    assert tight.outputs == roomy.outputs
    greedy = engine(model)
    greedy.run_offline(make_requests())
    assert roomy.outputs != greedy.outputs  # it did sample


def test_prefix_cache_hits_reuse_blocks_and_keep_tokens(model):
    shared = make_prompts([24], seed=5)[0]  # six full blocks of 4
    tails = make_prompts([3, 7, 1, 10], seed=6)
    prompts = [shared + t for t in tails]
    outputs = [5, 8, 4, 6]
    want = {i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(prompts, outputs))}
    cached = engine(model)
    rec = cached.run_offline(make_requests(prompts, outputs))
    rec.check()
    assert list(rec.cached_tokens) == [0, 16, 24, 24]  # request 1 came after the first chunk
    assert cached.outputs == want
    plain = engine(model, enable_prefix_caching=False)
    rec_plain = plain.run_offline(make_requests(prompts, outputs))
    assert rec_plain.cached_tokens.sum() == 0
    assert plain.outputs == want
    assert rec.computed_tokens.sum() < rec_plain.computed_tokens.sum()


def test_eos_stops_unless_replaying(model):
    eos = dense_greedy(model, PROMPTS[1], MAX_OUTPUT)[4]
    eos_model = make_model(eos_token_id=eos)  # same seed and names: the same weights
    long = [MAX_OUTPUT] * len(PROMPTS)
    e = engine(eos_model, stop="eos")
    rec = e.run_offline(make_requests(outputs=long))
    for i, p in enumerate(PROMPTS):
        full = dense_greedy(model, p, MAX_OUTPUT)
        want = full[: full.index(eos) + 1] if eos in full else full
        assert e.outputs[i] == want
        assert rec.num_output_tokens[i] == len(want)
    forced = engine(eos_model)  # stop="trace": end-of-sequence ignored
    forced.run_offline(make_requests(outputs=long))
    assert all(len(t) == MAX_OUTPUT for t in forced.outputs.values())


def test_records_are_the_simulators(model, tmp_path):
    """Same schema and dtypes, a lossless records_io round trip, and (the plan not depending on
    time for FCFS offline) the simulator's very step and request counts."""
    from experiments.records_io import read_records, write_records
    from horizon.model_shape import model_shape
    from horizon.policies.registry import make_policy
    from simulator.cost_model import RooflineCostModel
    from simulator.gpu import gpu_spec
    from simulator.simulation import Simulation

    e = engine(model, num_blocks=16)
    rec = e.run_offline(make_requests())
    back = read_records(write_records(rec, tmp_path / "records").requests.parent)
    assert back.digest() == rec.digest()
    cost = RooflineCostModel(model_shape("qwen2.5-0.5b"), gpu_spec("H200"))
    sim = Simulation(
        make_requests(), e.config.scheduler_config(e.num_blocks), make_policy("fcfs"), cost
    ).run()
    for f in fields(rec):
        a, b = getattr(rec, f.name), getattr(sim, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
    same = [
        "num_output_tokens",
        "status",
        "num_preemptions",
        "computed_tokens",
        "recomputed_tokens",
        "cached_tokens",
        "prefill_tokens",
        "decode_tokens",
        "num_running",
        "num_waiting",
        "kv_used_blocks",
    ]
    for name in same:
        np.testing.assert_array_equal(getattr(rec, name), getattr(sim, name), err_msg=name)
    assert np.all(rec.step_end > rec.step_start) and np.all(np.diff(rec.step_start) >= 0)


def test_event_and_reference_modes_give_the_same_run(model):
    a = engine(model, num_blocks=16, step_mode="event")
    ra = a.run_offline(make_requests())
    b = engine(model, num_blocks=16, step_mode="reference")
    rb = b.run_offline(make_requests())
    assert a.outputs == b.outputs
    for name in ("prefill_tokens", "decode_tokens", "kv_used_blocks", "computed_tokens"):
        np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name))


def test_requests_without_prompt_ids_get_seeded_synthetic_ones(model):
    reqs = [Request(i, 0.0, n, 4, 4) for i, n in enumerate([6, 11])]
    e = engine(model)
    e.run_offline(reqs)
    again = engine(model)
    again.run_offline([Request(i, 0.0, n, 4, 4) for i, n in enumerate([6, 11])])
    assert e.outputs == again.outputs and all(len(t) == 4 for t in e.outputs.values())


def test_bad_configs_are_named(model):
    with pytest.raises(ValueError, match="max_model_len"):
        engine(model, max_model_len=4096)  # the tiny model has 256 positions
    with pytest.raises(ValueError, match="stop"):
        EngineConfig(num_blocks=8, stop="never")
    with pytest.raises(ValueError, match="num_blocks"):
        engine(model, num_blocks=None)  # sizing from GPU memory needs a GPU
