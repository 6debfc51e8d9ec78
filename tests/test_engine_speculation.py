"""Speculative decoding in the engine (CPU, tiny model, fp32): greedy outputs token-identical
with and without speculation through chunked prefill, mixed steps and preemption; the runner's
rows and mirrored blocks agree with the scheduler's KV after every step with rejections; the
n-gram drafter; rejection sampling against the target distribution (chi-square)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from scipy.stats import chisquare  # noqa: E402
from test_engine_offline import (  # noqa: E402
    OUTPUT_LENS,
    PROMPTS,
    dense_greedy,
    engine,
    make_model,
    make_requests,
    one_thread,  # noqa: F401
)

from executor.drafter import Drafter, NgramDrafter, make_drafter  # noqa: E402
from executor.engine import EngineConfig  # noqa: E402
from executor.engine_backend import EngineBackend  # noqa: E402
from executor.model import DenseKVCache  # noqa: E402
from executor.model.testing import forward_prompts  # noqa: E402
from executor.sampling import SamplingBatch, SamplingParams, sample  # noqa: E402
from executor.verify import judge, next_drafts, resolve  # noqa: E402
from horizon.policies.registry import make_policy  # noqa: E402
from horizon.request import Request  # noqa: E402
from horizon.scheduler import Scheduler  # noqa: E402
from horizon.speculation import SpeculationConfig  # noqa: E402
from horizon.wall_clock import WallClock  # noqa: E402
from horizon.workload.builder import fresh_copy  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def dense(model):
    return {i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUT_LENS))}


@pytest.fixture(scope="module")
def plain_steps(model):
    """Steps of the same run without speculation (serial, as speculation runs)."""
    e = engine(model, async_steps=False)
    return len(e.run_offline(make_requests()).step_durations())


class OracleDrafter(Drafter):
    """Knows each prompt's greedy continuation; proposes it with each draft replaced by a
    random token with probability ``noise`` (seeded): real acceptance and real rejections."""

    def __init__(self, prompts, outputs, noise: float, seed: int = 0) -> None:
        self.full = {tuple(p): list(p) + list(o) for p, o in zip(prompts, outputs)}
        self.noise = noise
        self.rng = np.random.default_rng(seed)

    def propose(self, tokens, k):  # noqa: ANN001, ANN201
        for p, full in self.full.items():
            if tuple(tokens[: len(p)]) == p:
                nxt = np.array(full[len(tokens) : len(tokens) + k], dtype=np.int64)
                bad = self.rng.random(len(nxt)) < self.noise
                nxt[bad] = self.rng.integers(0, 512, int(bad.sum()))
                return nxt
        return np.zeros(0, dtype=np.int64)


def _spec(k: int, policy: str = "fixed") -> SpeculationConfig:
    return SpeculationConfig(policy=policy, num_draft_tokens=k)


# -- the n-gram drafter ---------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_earliest_longest_match():
    d = NgramDrafter()
    t = np.array([5, 1, 2, 3, 9, 8, 7, 1, 2, 3, 4, 1, 2, 3])
    assert d.propose(t, 3).tolist() == [9, 8, 7]  # 3-gram "1 2 3": its first place
    assert d.propose(t, 1).tolist() == [9]
    t2 = np.array([7, 2, 3, 6, 6, 1, 3])  # no 2-gram "1 3" before; 1-gram "3" at index 2
    assert d.propose(t2, 4).tolist() == [6, 6, 1, 3]
    assert d.propose(np.array([4, 5, 6]), 2).tolist() == []  # nothing matches
    assert d.propose(np.array([1, 2, 1]), 5).tolist() == [2, 1]  # fewer than k follow
    assert NgramDrafter(min_n=2).propose(t2, 4).tolist() == []  # 1-gram matches not wanted
    with pytest.raises(ValueError, match="NgramDrafter.min_n"):
        NgramDrafter(min_n=4, max_n=3)
    assert isinstance(make_drafter("ngram", max_n=4), NgramDrafter)
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("nope")


# -- greedy: token-identical ----------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("step_mode", ["event", "reference"])
def test_greedy_outputs_identical_with_speculation(model, dense, plain_steps, k, step_mode):
    e = engine(model, speculation=_spec(k), step_mode=step_mode)
    e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.3, seed=k)
    rec = e.run_offline(make_requests())
    assert e.outputs == dense
    s = e.scheduler
    assert s.num_accepted > 0 and s.num_accepted < s.num_drafted  # accepted and rejected
    mixed = rec.prefill_tokens > 0
    assert mixed.any()
    assert len(rec.step_durations()) < plain_steps


def test_verifications_padded_as_mixed_graphs_give_the_same_tokens(model, dense):
    """What a mixed-step graph replays for a verification step: its tokens padded to a token
    bucket, its sequences to max_num_seqs (the CPU runs the padded step eagerly)."""
    e = engine(model, speculation=_spec(3))
    e.runner.pad_mixed = e.runner.pad_decodes = True
    e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.3)
    seen = []
    real = e.runner._mixed_step

    def spy(tokens, m, v0=-1, v1=0):  # noqa: ANN001, ANN202
        seen.append((tokens, v1 - v0))
        return real(tokens, m, v0, v1)

    e.runner._mixed_step = spy
    e.run_offline(make_requests())
    assert e.outputs == dense
    assert any(n > 0 and t > n for t, n in seen)  # verifications in padded mixed steps
    assert e.scheduler.num_accepted > 0


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter check (GPU: spec_bench)"
)
def test_verifications_through_the_triton_kernels(model, dense):
    """The Triton attention and fused kernels (interpreter) on verification steps."""
    pytest.importorskip("triton")
    e = engine(model, attention_backend="triton", cuda_graphs=False, speculation=_spec(3))
    e.runner.pad_mixed = e.runner.pad_decodes = True
    e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.3)
    e.run_offline(make_requests(PROMPTS[:3], OUTPUT_LENS[:3]))
    assert e.outputs == {i: dense[i] for i in range(3)}
    assert e.scheduler.num_accepted > 0


def test_greedy_identical_with_the_ngram_drafter_and_under_kv_pressure(model, dense):
    """The n-gram drafter on the random-weight model (few matches) and a pool so small that
    requests are preempted and recomputed between verifications."""
    e = engine(model, speculation=_spec(3), num_blocks=24)
    assert isinstance(e.runner.drafter, NgramDrafter)
    e.run_offline(make_requests())
    assert e.outputs == dense
    e2 = engine(model, speculation=_spec(4, "adaptive"), num_blocks=24)
    e2.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.2)
    rec = e2.run_offline(make_requests())
    assert e2.outputs == dense
    assert rec.num_preemptions.sum() > 0


def test_eos_stops_inside_an_accepted_run(model, dense):
    """With stop="eos", a verification that emits an end-of-sequence token ends there (its
    later accepted drafts are dropped) and the request finishes; outputs equal plain runs."""
    eos = dense[4][3]  # the 4th token of request 4: an EOS for this run
    m = make_model(eos_token_id=eos)
    plain = engine(m, stop="eos")
    plain.run_offline(make_requests())
    e = engine(m, stop="eos", speculation=_spec(4))
    e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.0)
    e.run_offline(make_requests())
    assert e.outputs == plain.outputs
    assert e.outputs[4] == dense[4][:4]


def test_a_draft_model_proposes_and_outputs_stay_identical(model, dense):
    """The draft-model hook: the target itself as its draft model accepts (nearly) every
    draft; an unrelated model (other weights) few; greedy outputs are the plain ones either
    way, through preemptions (its caches follow the accepted history)."""
    from executor.draft_model import DraftModelDrafter

    e = engine(model, speculation=_spec(3))
    e.runner.drafter = DraftModelDrafter(model)
    e.run_offline(make_requests())
    s = e.scheduler
    assert e.outputs == dense
    r = e.runner
    assert r.num_accepted == s.num_accepted and r.num_accepted >= 0.95 * r.num_proposed
    assert not e.runner.drafter._caches  # every request forgotten
    other = make_model()
    torch.manual_seed(3)
    for p in other.parameters():
        p.data.normal_(0.0, 0.2)
    e2 = engine(model, speculation=_spec(2), num_blocks=24)
    e2.runner.drafter = DraftModelDrafter(other)
    rec = e2.run_offline(make_requests())
    assert e2.outputs == dense
    assert e2.runner.num_accepted < 0.5 * e2.runner.num_proposed
    assert rec.num_preemptions.sum() > 0
    assert isinstance(make_drafter("draft_model", model=model), DraftModelDrafter)


def test_speculation_needs_serial_steps(model):
    with pytest.raises(ValueError, match="EngineConfig.async_steps"):
        EngineConfig(num_blocks=8, speculation=_spec(2), async_steps=True)
    assert not EngineConfig(num_blocks=8, speculation=_spec(2)).pipelined
    c = EngineConfig(num_blocks=8, speculation={"num_draft_tokens": 2})
    assert c.scheduler_config(8).speculation == _spec(2)


# -- KV integrity after every step ----------------------------------------------------------------
def _drive(e, requests, check) -> None:  # noqa: ANN001
    """The serial serving loop by hand, ``check()`` after every update."""
    e.runner.reset()
    sched = Scheduler(e.config.scheduler_config(e.num_blocks), make_policy("fcfs"))
    e.scheduler = sched
    backend = EngineBackend(e.runner, sched, WallClock(), False, frozenset(), "trace")
    for r in requests:
        sched.add(r)
    steps = 0
    while sched.has_work:
        plan = sched.schedule(float(steps))
        result = backend.execute(plan)
        sched.update(plan, result, float(steps + 1))
        check(sched, plan, result)
        steps += 1
        assert steps < 500, "no progress"
    e.outputs = backend.outputs


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    noise=st.floats(0.0, 1.0),
    k=st.integers(1, 6),
    policy=st.sampled_from(["fixed", "adaptive", "batch_limited"]),
    num_blocks=st.integers(22, 60),
    seed=st.integers(0, 2**16),
)
def test_kv_integrity_after_every_step_with_rejections(
    model, dense, noise, k, policy, num_blocks, seed
):
    spec = SpeculationConfig(policy=policy, num_draft_tokens=k, max_batch=3)
    e = engine(model, speculation=spec, num_blocks=num_blocks)
    e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=noise, seed=seed)
    seen = {"verifies": 0}

    def check(sched, plan, result):  # noqa: ANN001, ANN202
        sched.check_integrity()
        e.runner.check_integrity()
        e.runner.check_against(list(sched.running.values()), sched.kv.blocks_of)
        assert sched.kv.num_draft_tails == 0
        seen["verifies"] += len(plan.verifies)

    _drive(e, make_requests(), check)
    assert e.outputs == dense
    assert seen["verifies"] > 0


# -- sampling: distribution-preserving ------------------------------------------------------------
def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of ``counts`` against ``probs``, tokens of expected count < 5 pooled."""
    n = counts.sum()
    probs = probs / probs.sum()
    big = probs * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(probs[big] * n, probs[~big].sum() * n)
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep]).pvalue)


@pytest.fixture(scope="module")
def three_rows(model):
    """Target logits of a prompt's last token and two drafts after it (fp32, [3, vocab]), and
    the drafts: the second and third most likely tokens at their rows (often rejected, often
    accepted)."""
    prompt = PROMPTS[1]
    base = forward_prompts(model, [prompt], [DenseKVCache(model.config.num_layers)])[-1]
    d1 = int(base.topk(2).indices[1])
    row1 = forward_prompts(model, [prompt + [d1]], [DenseKVCache(model.config.num_layers)])[-1]
    d2 = int(row1.topk(3).indices[2])
    full = forward_prompts(model, [prompt + [d1, d2]], [DenseKVCache(model.config.num_layers)])
    return full[-3:].float(), [d1, d2]


def test_rejection_sampling_matches_the_target_distribution(three_rows):
    """Many seeded verifications of the same two drafts at temperature 0.4: the first emitted
    token is distributed as p_0, and the second (given the first draft accepted) as p_1;
    a chi-square test each. The same test on a wrong rule (drawing from p_0 instead of the
    residual after a rejection) fails: it can tell."""
    logits, (d1, d2) = three_rows
    n = 20_000
    temp = 0.4
    params = [SamplingParams(temperature=temp, seed=s + 1) for s in range(n) for _ in range(3)]
    steps = [7 + i for _ in range(n) for i in range(3)]
    batch = SamplingBatch.from_params(params, steps)
    rows = logits.repeat(n, 1)
    nxt = torch.from_numpy(next_drafts([np.array([d1, d2])] * n))
    accept, alt = judge(rows, nxt, batch)
    emitted = resolve(accept.numpy(), alt.numpy(), [np.array([d1, d2])] * n, [3] * n)
    p0 = torch.softmax(logits[0] / temp, -1).numpy().astype(np.float64)
    p1 = torch.softmax(logits[1] / temp, -1).numpy().astype(np.float64)
    first = np.array([t[0] for t in emitted])
    vocab = len(p0)
    assert 0.05 < p0[d1] < 0.95  # both branches are exercised
    assert _chi2(np.bincount(first, minlength=vocab), p0) > 1e-3
    second = np.array([t[1] for t in emitted if t[0] == d1])
    assert len(second) > 1000
    assert _chi2(np.bincount(second, minlength=vocab), p1) > 1e-3
    # the wrong rule: on rejection, a plain draw from p_0 (the draft counted twice)
    plain = sample(rows[0::3], SamplingBatch.from_params(params[0::3], steps[0::3])).numpy()
    wrong = np.where(accept.numpy()[0::3] == 1, d1, plain)
    assert _chi2(np.bincount(wrong, minlength=vocab), p0) < 1e-6


def test_greedy_rows_of_judge_are_the_argmax(three_rows):
    logits, (d1, d2) = three_rows
    greedy = logits.argmax(-1)
    nxt = torch.from_numpy(next_drafts([np.array([int(greedy[0]), d2])]))
    accept, alt = judge(logits, nxt, None)
    assert accept.tolist() == [1, int(greedy[1]) == d2, 0]
    assert alt.tolist() == greedy.tolist()
    out = resolve(accept.numpy(), alt.numpy(), [np.array([int(greedy[0]), d2])], [5])
    assert out == [[int(greedy[0]), int(greedy[1])]]
    assert resolve(accept.numpy(), alt.numpy(), [np.array([int(greedy[0]), d2])], [1]) == [
        [int(greedy[0])]
    ]


def test_seeded_sampled_speculation_is_reproducible(model, dense):
    """Temperature > 0 through the engine: the same seed gives the same tokens, integrity
    holds with rejections, and lengths are the trace's."""
    outs = []
    for _ in range(2):
        e = engine(model, speculation=_spec(3), sampling=SamplingParams(temperature=0.15))
        e.runner.drafter = OracleDrafter(PROMPTS, dense.values(), noise=0.3)
        e.run_offline(make_requests())
        outs.append(e.outputs)
        assert e.scheduler.num_accepted > 0
    assert outs[0] == outs[1]
    assert {i: len(o) for i, o in outs[0].items()} == dict(enumerate(OUTPUT_LENS))


def test_requests_without_speculation_take_no_verify_path(model, dense):
    """Off: no drafter, and plans never verify (the engine's steps are the plain ones)."""
    e = engine(model)
    assert e.runner.drafter is None
    rec = e.run_offline(make_requests())
    assert e.outputs == dense
    assert e.scheduler.num_drafted == 0 and not e.runner._seqs
    assert rec.num_output_tokens.tolist() == OUTPUT_LENS


def test_spec_bench_runs_on_the_cpu(tmp_path, capsys):
    """python -m executor.spec_bench --model tiny: every cell's greedy outputs equal plain's,
    the table comes last, the JSON has every row."""
    import json

    from executor.spec_bench import main

    out = tmp_path / "spec.json"
    args = ["--model", "tiny", "--device", "cpu", "--batch", "1,2", "--k", "1,3"]
    assert main([*args, "--max-new", "8", "--repeats", "1", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["batch"], r["k"]) for r in rows] == [(1, 0), (1, 1), (1, 3), (2, 0), (2, 1), (2, 3)]
    assert all(r["identical"] and r["tokens"] == 8 * r["batch"] for r in rows)
    assert result["batch1_best"]["k"] in (1, 3)
    last = capsys.readouterr().out.strip().splitlines()
    assert last[-7].split() == [
        "batch",
        "k",
        "tok/s",
        "x",
        "plain",
        "steps",
        "tok/step",
        "accept",
        "identical",
    ]


def test_engine_replay_runs_a_speculation_manifest(tmp_path, monkeypatch, model):
    """A fidelity manifest whose scheduler speculates replays on the engine (n-gram drafts,
    serial steps): records check, every request runs to its trace length."""
    import dataclasses

    import experiments.engine_replay as replay
    from executor.engine import Engine
    from experiments.fidelity_manifest import Case, Manifest, PolicySpec
    from horizon.metrics.records import RunRecords
    from horizon.scheduler_config import SchedulerConfig
    from horizon.workload.requests_file import save_requests

    engines = []

    def tiny(name: str, device: str, config: EngineConfig) -> Engine:
        engines.append(Engine(model, config))
        return engines[-1]

    monkeypatch.setattr(replay, "_engine", tiny)
    reqs = [Request(i, 0.01 * i, 5 + i % 4, 64, 3 + i % 5) for i in range(6)]
    save_requests(reqs, tmp_path / "reqs.json")
    sc = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                         max_model_len=128, speculation=_spec(2))  # fmt: skip
    case = Case("c", "fidelity", "synthetic", 100.0, 0, "reqs.json", ("fcfs",))
    policies = {"fcfs": PolicySpec("fcfs")}
    Manifest("tiny", dataclasses.asdict(sc), 1.0, 0.05, policies, (case,), {}).save(
        tmp_path / "manifest.json"
    )
    replay.replay_manifest(str(tmp_path / "manifest.json"), str(tmp_path / "out"), "cpu", None)
    rec = RunRecords.load_npz(str(tmp_path / "out" / "c" / "fcfs" / "records.npz"))
    rec.check()
    np.testing.assert_array_equal(rec.num_output_tokens, [r.true_output_tokens for r in reqs])
    assert engines[0].config.speculation == _spec(2) and engines[0].scheduler.num_drafted > 0


class FixedDrafter(Drafter):
    """Proposes the same tokens for every request."""

    def __init__(self, tokens) -> None:  # noqa: ANN001
        self.tokens = np.array(tokens, dtype=np.int64)

    def propose(self, tokens, k):  # noqa: ANN001, ANN201
        return self.tokens[:k]


def test_sampled_tokens_through_the_engine_follow_the_target(model):
    """End to end at temperature 0.4: 2,000 requests of one prompt (seeds differ), each
    verifying one fixed draft for its second token; that token's counts against its exact
    marginal sum_t1 p0(t1) p1(. | t1) from dense forwards (chi-square); plain sampling's too."""
    prompt, temp, n = PROMPTS[1], 0.4, 2000
    layers = model.config.num_layers
    base = forward_prompts(model, [prompt], [DenseKVCache(layers)])[-1]
    p0 = torch.softmax(base / temp, -1).double()
    vocab = len(p0)
    conts = [prompt + [t] for t in range(vocab)]
    rows = forward_prompts(model, conts, [DenseKVCache(layers) for _ in conts])
    ends = np.cumsum([len(c) for c in conts]) - 1
    p1 = torch.softmax(rows[ends] / temp, -1).double()
    marginal = (p0[:, None] * p1).sum(0).numpy()
    draft = int(marginal.argmax())  # often accepted, often not
    reqs = [Request(i, 0.0, len(prompt), 3, 3, prompt_token_ids=tuple(prompt)) for i in range(n)]
    cfg = dict(num_blocks=400, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=64)
    second = {}
    for name, spec in (("spec", _spec(1)), ("plain", None)):
        e = engine(model, speculation=spec, sampling=SamplingParams(temperature=temp), **cfg)
        e.runner.drafter = FixedDrafter([draft])
        e.run_offline(reqs if name == "spec" else [fresh_copy(r) for r in reqs])
        second[name] = np.array([e.outputs[i][1] for i in range(n)])
        if spec is not None:
            assert 0.1 * n < e.runner.num_accepted < 0.9 * n, e.runner.num_accepted
    for name, got in second.items():
        assert _chi2(np.bincount(got, minlength=vocab), marginal) > 1e-3, name
