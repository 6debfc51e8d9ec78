"""Stated acceptance in the engine (random-weight targets) and the paged draft model (CPU, tiny
model, fp32): accepted counts are the simulator's draws and follow the geometric law
(chi-square, which a wrong rate fails); histories, KV and runner agree with the scheduler after
every step; each emitted non-draft token is the target's greedy token after the accepted
drafts; the paged draft model proposes the dense reference's drafts; spec_bench's stated grid."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import

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

from executor.draft_model import DraftModelDrafter  # noqa: E402
from executor.drafter import Drafter, NgramDrafter, make_drafter  # noqa: E402
from executor.engine import EngineConfig  # noqa: E402
from executor.engine_backend import EngineBackend  # noqa: E402
from executor.model import DenseKVCache  # noqa: E402
from executor.model.testing import forward_prompts  # noqa: E402
from executor.paged_draft import PagedDraftModelDrafter  # noqa: E402
from horizon.acceptance import AcceptanceModel  # noqa: E402
from horizon.policies.registry import make_policy  # noqa: E402
from horizon.request import Request  # noqa: E402
from horizon.scheduler import Scheduler  # noqa: E402
from horizon.speculation import SpeculationConfig  # noqa: E402
from horizon.wall_clock import WallClock  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return make_model()


class RandomDrafter(Drafter):
    """Always ``k`` seeded random tokens: drafts the target would not pick."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def propose(self, tokens, k):  # noqa: ANN001, ANN201
        return self.rng.integers(0, 512, k)


def _spec(k: int) -> SpeculationConfig:
    return SpeculationConfig(policy="fixed", num_draft_tokens=k)


def _drive(e, requests):  # noqa: ANN001, ANN202
    """The serial loop by hand; integrity and runner-vs-scheduler after every step. Returns
    each verification as (request id, outputs before, k, drafts proposed, tokens emitted)."""
    e.runner.reset()
    e.runner.acceptance = e.config.acceptance
    sched = Scheduler(e.config.scheduler_config(e.num_blocks), make_policy("fcfs"))
    backend = EngineBackend(e.runner, sched, WallClock(), False, frozenset(), "trace")
    for r in requests:
        sched.add(r)
    log, steps = [], 0
    real = e.runner._drafts
    seen = {}

    def spy(plan, limits, stop_ids):  # noqa: ANN001, ANN202
        ver = real(plan, limits, stop_ids)
        seen["drafts"] = [d.copy() for d in ver.drafts]
        return ver

    e.runner._drafts = spy
    while sched.has_work:
        plan = sched.schedule(float(steps))
        before = [(r.request_id, r.num_output_tokens, k) for r, k in plan.verifies]
        result = backend.execute(plan)
        sched.update(plan, result, float(steps + 1))
        if plan.verifies:
            for (rid, g, k), d, a in zip(before, seen["drafts"], result.accepted):
                log.append((rid, g, k, d, a))
        sched.check_integrity()
        e.runner.check_integrity()
        e.runner.check_against(list(sched.running.values()), sched.kv.blocks_of)
        assert sched.kv.num_draft_tails == 0
        steps += 1
        assert steps < 5000, "no progress"
    sched.finish_run()
    sched.check_integrity()
    return backend.outputs, log


def _geometric_probs(alpha: float, k: int) -> np.ndarray:
    p = np.array([alpha**i * (1 - alpha) for i in range(k)] + [alpha**k])
    return p / p.sum()


def test_stated_acceptance_follows_the_geometric_law_and_the_simulators_draws(model):
    """2,000 verifications of 4 random drafts at alpha = 0.6: the accepted counts are
    exactly the simulator's AcceptanceModel draws for the same requests and positions, their
    histogram passes a chi-square test against the geometric law and fails one at 0.5; the
    drafts the target's judgement would accept (random tokens: almost none) do not matter."""
    alpha, k = 0.6, 4
    reqs = [
        Request(i, 0.0, len(PROMPTS[i % 8]), 120, 120, prompt_token_ids=tuple(PROMPTS[i % 8]))
        for i in range(40)
    ]
    e = engine(model, speculation=_spec(k), acceptance=("geometric", alpha), seed=3,
               max_num_seqs=8, max_num_batched_tokens=64, num_blocks=1400,
               max_model_len=200)  # fmt: skip
    assert e.config.acceptance == AcceptanceModel.geometric(alpha, seed=3)
    e.runner.drafter = RandomDrafter()
    outputs, log = _drive(e, reqs)
    assert {i: len(o) for i, o in outputs.items()} == {i: 120 for i in range(40)}
    sim = AcceptanceModel.geometric(alpha, seed=3)
    stand_in = [(SimpleNamespace(request_id=rid, num_output_tokens=g), len(d))
                for rid, g, _, d, _ in log]  # fmt: skip
    np.testing.assert_array_equal([a for *_, a in log], sim.sample(stand_in))
    full = np.array([a for _, _, k_, d, a in log if k_ == k and len(d) == k])
    assert len(full) > 1500
    counts = np.bincount(full, minlength=k + 1)
    assert chisquare(counts, _geometric_probs(alpha, k) * len(full)).pvalue > 1e-3
    assert chisquare(counts, _geometric_probs(0.5, k) * len(full)).pvalue < 1e-6


def test_stated_emissions_are_accepted_drafts_then_the_targets_token(model):
    """Every verification emits its first ``a`` drafts and then the target's greedy token
    over them (from one dense forward of each final history); outputs have the trace's
    lengths; with acceptance off the same drafts give the plain greedy outputs."""
    e = engine(model, speculation=_spec(3), acceptance=("rates", (0.9, 0.5)), num_blocks=40)
    e.runner.drafter = RandomDrafter(seed=1)
    outputs, log = _drive(e, make_requests())
    assert {i: len(o) for i, o in outputs.items()} == dict(enumerate(OUTPUT_LENS))
    assert sum(a for *_, a in log) > 10  # random drafts accepted: only the stated model's doing
    layers = model.config.num_layers
    target_pos = {i: set(range(len(o))) for i, o in outputs.items()}
    for rid, g, _, d, a in log:
        emitted = outputs[rid][g : g + a + 1]
        assert emitted[:a] == d[:a].tolist()
        target_pos[rid] -= set(range(g, g + a))  # accepted drafts: not the target's tokens
    for rid, out in outputs.items():
        prompt = PROMPTS[rid]
        logits = forward_prompts(model, [prompt + out], [DenseKVCache(layers)])
        greedy = logits.argmax(-1).tolist()
        for p in target_pos[rid]:
            assert out[p] == greedy[len(prompt) + p - 1], (rid, p)
    plain = engine(model, speculation=_spec(3), num_blocks=40)
    plain.runner.drafter = RandomDrafter(seed=1)
    plain.run_offline(make_requests())
    assert plain.outputs == {
        i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUT_LENS))
    }


def test_engine_config_acceptance():
    spec = _spec(2)
    c = EngineConfig(num_blocks=8, speculation=spec, acceptance=("geometric", 0.7, 5))
    assert c.acceptance == AcceptanceModel.geometric(0.7, 5)
    assert c.acceptance.label == "stated acceptance α=0.7 (seed 5)"
    assert EngineConfig(num_blocks=8).acceptance is None
    with pytest.raises(ValueError, match="EngineConfig.acceptance needs speculation"):
        EngineConfig(num_blocks=8, acceptance=("geometric", 0.7))
    with pytest.raises(ValueError, match="EngineConfig.acceptance must be"):
        EngineConfig(num_blocks=8, speculation=spec, acceptance=("uniform", 0.7))
    with pytest.raises(ValueError, match="AcceptanceModel.rates"):
        EngineConfig(num_blocks=8, speculation=spec, acceptance=("geometric", 1.5))


def test_ngram_padding():
    t = np.array([7, 2, 3, 6, 6, 1, 3])
    assert NgramDrafter(pad=True).propose(t, 6).tolist() == [6, 6, 1, 3, 3, 3]
    assert NgramDrafter(pad=True).propose(np.array([4, 5, 6]), 2).tolist() == [6, 6]
    assert NgramDrafter().propose(np.array([4, 5, 6]), 2).tolist() == []


# -- the paged draft model ------------------------------------------------------------------------
NOISE = 0.01


def test_paged_draft_model_proposes_the_dense_references_drafts(model):
    """A draft model near the target (its weights perturbed: drafts accepted and rejected,
    all accepted at times) through preemptions: the
    paged drafter's drafts equal the dense reference drafter's at every verification, and
    outputs are the plain greedy ones; too few slots evict requests not in the step."""
    other = make_model()
    torch.manual_seed(3)
    for p in other.parameters():
        p.data.add_(torch.randn_like(p), alpha=NOISE)  # the target's weights, perturbed
    proposals = {}
    for name in ("dense", "paged"):
        e = engine(model, speculation=_spec(2), num_blocks=20)
        if name == "dense":
            e.runner.drafter = DraftModelDrafter(other)
        else:
            e.runner.drafter = PagedDraftModelDrafter(other, max_seqs=4, max_len=128)
        got = proposals[name] = []
        real = e.runner._verified

        def spy(ver, commit, real=real, got=got):  # noqa: ANN001, ANN202
            got.append([d.tolist() for d in ver.drafts])  # as judged (read back by then)
            return real(ver, commit)

        e.runner._verified = spy
        rec = e.run_offline(make_requests())
        assert e.outputs == {
            i: dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTPUT_LENS))
        }
        assert rec.num_preemptions.sum() > 0
        assert 0.2 < e.runner.num_accepted / e.runner.num_proposed < 0.5  # both ways
    assert proposals["paged"] == proposals["dense"]
    d = e.runner.drafter
    assert not d._slots and len(d._free) == 4 and d.num_steps > 0 and d.num_prefill_tokens > 0
    assert 0 < d.num_two_token_steps < d.num_calls  # both kinds of first forward
    assert isinstance(
        make_drafter("paged_draft_model", model=model, max_seqs=2, max_len=64),
        PagedDraftModelDrafter,
    )


def test_paged_draft_model_evicts_and_catches_up(model):
    """Two slots for three requests: a request whose slot was taken is prefilled again; the
    target as its own draft model proposes its greedy continuation every time."""
    d = PagedDraftModelDrafter(model, max_seqs=2, max_len=64, block_size=4)
    hist = {i: np.array(PROMPTS[i], dtype=np.int64) for i in range(3)}
    for rnd in range(3):
        for pair in ((0, 1), (2, 0), (1, 2)):
            hs = [hist[i] for i in pair]
            out = d.propose_batch(hs, [3, 2], list(pair))
            for i, h, dr in zip(pair, hs, out):
                want = dense_greedy(model, h.tolist(), len(dr))
                assert dr.tolist() == want
                keep = (rnd + i) % (len(dr) + 1)  # accept some drafts, then a token of ours
                hist[i] = np.concatenate([h, dr[:keep], [int(want[-1]) % 500 + 1]])
    with pytest.raises(RuntimeError, match="max_seqs=2"):
        d.propose_batch([hist[i] for i in range(3)], [1, 1, 1], [0, 1, 2])


# -- spec_bench's stated grid ---------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 5])
def test_held_grid_accepts_what_the_simulator_accepts(model, k):
    """The held-batch grid's cell on the engine (tiny target, paged draft model, stated
    alpha 0.7) and the simulator's run of the same requests and scheduler configuration
    (experiments.spec_crossover's, with a constant step cost): the same plans, so the same
    drafts proposed and accepted, request for request."""
    from sched_driver import ConstantCost

    from executor.spec_held import HeldWorkload, held_engine, run_cell
    from horizon.policies import make_policy as make_sched_policy
    from horizon.scheduler_config import SchedulerConfig
    from simulator import Simulation

    work = HeldWorkload(prompt=20, out_base=4, out_span=9)
    e = held_engine(model, 3, work, k)
    d = PagedDraftModelDrafter(make_model(), max_seqs=3, max_len=e.config.max_model_len)
    row = run_cell(e, work, 3, k, 0.7, d)
    cfg = SchedulerConfig(num_blocks=4000, max_num_seqs=3, speculation=_spec(k))
    sim = Simulation(work.requests(3), cfg, make_sched_policy("fcfs"), ConstantCost(),
                     pipelined=True, arrivals_at_step_boundaries=True,
                     acceptance=AcceptanceModel.geometric(0.7, seed=0))  # fmt: skip
    rec = sim.run()
    s, es = sim.scheduler, e.scheduler
    assert (es.num_drafted, es.num_accepted) == (s.num_drafted, s.num_accepted)
    assert row["accepted_per_draft"] == s.num_accepted / s.num_drafted
    assert (
        row["tokens"]
        == int(rec.num_output_tokens.sum())
        == sum(r.true_output_tokens for r in work.requests(3))
    )


def test_spec_bench_stated_grid_on_the_cpu(tmp_path, capsys):
    """python -m executor.spec_bench --model tiny --drafter draft:tiny --acceptance ...: the
    held-batch grid (2B+6 requests), every speculative row labelled with its stated
    acceptance, crossovers per k, the draft cost, the table last."""
    from executor.spec_bench import main

    out = tmp_path / "stated.json"
    args = ["--model", "tiny", "--device", "cpu", "--drafter", "draft:tiny", "--batch", "1,2"]
    args += ["--acceptance", "0.7", "--k", "1,3", "--prompt-len", "20", "--out-base", "4"]
    args += ["--out-span", "6", "--repeats", "1", "--draft-cost", "2", "--json-out", str(out)]
    sim = {"runs": [{"drafter": "draft_0.5b", "alpha": 0.7, "batch": b, "k": k,
                     "speedup": 1.3 if b == 1 else 0.9, "tpot_ratio": 1.0,
                     "accepted_per_draft": 0.5} for b in (1, 2) for k in (1, 3)]}  # fmt: skip
    (tmp_path / "sim.json").write_text(json.dumps(sim))
    assert main([*args, "--compare", str(tmp_path / "sim.json")]) == 0
    res = json.loads(out.read_text())
    assert res["crossover_batch_simulated"] == {"alpha=0.7 k=1": 2, "alpha=0.7 k=3": 2}
    assert all(r["sim_speedup"] == (1.3 if r["batch"] == 1 else 0.9) for r in res["rows"] if r["k"])
    rows = res["rows"]
    assert [(r["batch"], r["k"]) for r in rows] == [(1, 0), (1, 1), (1, 3), (2, 0), (2, 1), (2, 3)]
    assert all(r["tokens"] == sum(4 + (i * 97) % 6 for i in range(2 * r["batch"] + 6))
               for r in rows)  # fmt: skip
    spec = [r for r in rows if r["k"]]
    assert all(r["acceptance_model"] == "stated acceptance α=0.7 (seed 0)" for r in spec)
    assert all(r["draft_steps"] > 0 and r["accepted_per_draft"] is not None for r in spec)
    assert all(0 < r["draft_share"] < 1 and r["draft_ms_per_step"] > 0 for r in spec)
    assert set(res["crossover_batch"]) == {"alpha=0.7 k=1", "alpha=0.7 k=3"}
    assert res["draft_cost"][0]["paged_ms_per_position"] > 0
    assert "stated acceptance α=0.7" in res["title"]
    last = capsys.readouterr().out.strip().splitlines()
    assert "stated acceptance α=0.7" in last[-8] and last[-7].split()[:3] == ["batch", "alpha", "k"]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter check (GPU: spec_bench)"
)
def test_paged_draft_model_through_the_triton_kernels(model):
    """The Triton attention and fused kernels (interpreter) in the drafter's prefill and decode
    steps: the target as its own draft model proposes its greedy continuation."""
    pytest.importorskip("triton")
    d = PagedDraftModelDrafter(model, max_seqs=2, max_len=64, backend="triton", cuda_graphs=False)
    hs = [np.array(PROMPTS[1], dtype=np.int64), np.array(PROMPTS[3], dtype=np.int64)]
    for _ in range(2):
        out = d.propose_batch(hs, [3, 2], [0, 1])
        for h, dr in zip(hs, out):
            assert dr.tolist() == dense_greedy(model, h.tolist(), len(dr))
        hs = [np.concatenate([h, dr[:2], [7]]) for h, dr in zip(hs, out)]
    assert d.num_two_token_steps == 2  # the prompts' last two; a request that accepted all


def test_a_draft_model_with_fewer_embedding_rows_than_the_target_is_refused(model):
    """A random-weight target emits ids in all its rows: a draft model reading fewer (the
    0.5B shape's 151,936 against the 7B's 152,064) would index past its embedding."""
    small = make_model(vocab_size=model.config.vocab_size - 8)
    options = (("model", small), ("max_seqs", 4), ("max_len", 128), ("device", "cpu"))
    with pytest.raises(ValueError, match="drafter: vocab_size"):
        engine(model, speculation=_spec(2), drafter="paged_draft_model", drafter_options=options)
    wide = make_model(vocab_size=model.config.vocab_size + 8)
    options = (("model", wide),) + options[1:]
    e = engine(model, speculation=_spec(2), drafter="paged_draft_model", drafter_options=options)
    assert e.runner.drafter.vocab_size == model.config.vocab_size + 8
