"""Speculation with acceptance drawn ahead (horizon.drawn_speculation): the same records, plans
and totals as the per-step mechanics, byte for byte, whatever the pool, policy or loop; the
draws ahead are the per-step draws, and a run whose draws ahead differ does not pass."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from sched_driver import policy_for_test, random_requests

from horizon.acceptance import AcceptanceModel
from horizon.drawn_speculation import DrawnSpeculation
from horizon.model_shape import model_shape
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from horizon.spec_tracks import ModelDraws
from horizon.speculation import SpeculationConfig
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.trace_draws import TraceDraws
from simulator.verification_cost import VERIFY_SHAPES, DraftCost, VerifyCost

SHAPE, GPU = model_shape("qwen2.5-7b"), gpu_spec("H200")
ROOF = make_cost_model("roofline", shape=SHAPE, gpu=GPU)
FIT = make_cost_model(
    "engine_fitted", shape=SHAPE, gpu=GPU, path="calibration/h200_qwen2.5-7b_online.csv.gz"
)

# Larger runs (seed, requests, max prompt, max output, rate, policy, speculation (policy, k,
# max_batch), alpha, blocks, block size, max_num_seqs, token budget, cost model, engine loop):
# an ample pool (no per-request step may run), a small one (preemptions of speculating
# requests), batch-limited speculation switching off and on, reserving policies
CASES = [
    (11, 300, 400, 300, 30, "fcfs", ("fixed", 4, None), 0.7, 3000, 16, 64, 512, "fit", True),
    (12, 200, 120, 200, 60, "memory_first", ("fixed", 6, None), 0.8, 300, 8, 32, 256, "roof",
     False),
    (13, 250, 300, 150, 40, "vllm", ("batch_limited", 3, 6), 0.5, 600, 16, 24, 160, "fit", True),
    (21, 120, 60, 120, 200, "fcfs", ("fixed", 4, None), 0.7, 90, 4, 16, 96, "roof", False),
    (22, 120, 80, 100, 300, "sjf_prompt", ("fixed", 3, None), 0.9, 70, 2, 12, 48, "fit", True),
    (23, 150, 200, 120, 100, "horizon", ("batch_limited", 5, 3), 0.7, 200, 4, 16, 128, "roof",
     True),
]  # fmt: skip


def _simulate(reqs, cfg, policy, acceptance, cost, pipelined, draws_ahead, **costs):  # noqa: ANN001, ANN003, ANN202
    """``costs``: ``verify_cost`` / ``draft_cost`` of the Simulation."""
    sim = Simulation(
        reqs,
        cfg,
        policy_for_test(policy),
        cost,
        acceptance=acceptance,
        pipelined=pipelined,
        arrivals_at_step_boundaries=pipelined,
        check_every=1,  # integrity (scheduler, KV, pool, tracks) after every step
        draws_ahead=draws_ahead,
        **costs,
    )
    rec = sim.run()
    assert sim.scheduler.draws_ahead == draws_ahead
    return sim, rec


@pytest.mark.parametrize("key", CASES, ids=lambda key: f"seed{key[0]}")
def test_drawn_runs_are_byte_identical_to_per_step_runs(key, monkeypatch):
    """Each run twice, drawn ahead and per step (integrity after every step): the same
    records (digest of every array), drafts, accepted drafts, tokens and preemptions."""
    seed, n, prompt, out, rate, policy, (sp, k, mb), alpha, blocks, bs, seqs, budget, cost, pipe = (
        key
    )
    seen = _count_paths(monkeypatch)
    reqs = random_requests(random.Random(seed), n, prompt, out, rate=rate)
    spec = SpeculationConfig(policy=sp, num_draft_tokens=k, max_batch=mb)
    cfg = SchedulerConfig(
        num_blocks=blocks,
        block_size=bs,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        speculation=spec,
    )
    acc = AcceptanceModel.geometric(alpha, seed)
    runs = []
    for ahead in (True, False):
        sim, rec = _simulate(
            [_fresh(r) for r in reqs], cfg, policy, acc, FIT if cost == "fit" else ROOF, pipe,
            draws_ahead=ahead,
        )  # fmt: skip
        s = sim.scheduler
        assert s.tokens_emitted == int(rec.num_output_tokens.sum())
        assert s.num_drafted > s.num_accepted > 0
        runs.append((rec.digest(), s.num_drafted, s.num_accepted, int(rec.num_preemptions.sum())))
    assert runs[0] == runs[1]
    if blocks >= 3000:  # ample: every speculating step took the drawn blocks in one call
        assert not seen["_careful"]
    if blocks <= 90:
        assert runs[0][3] > 0 and seen["tracked preempted"]


def test_adaptive_speculation_runs_per_step():
    """A policy that is not ``steady`` (adaptive ``k`` from measured acceptance) is not drawn
    ahead: the simulator's scheduler falls back to the per-step mechanics, whatever
    ``draws_ahead`` asks, with the same records either way."""
    reqs = random_requests(random.Random(4), 80, 100, 120, rate=80)
    cfg = SchedulerConfig(
        num_blocks=400, max_num_seqs=16, speculation=SpeculationConfig(policy="adaptive")
    )
    acc = AcceptanceModel.geometric(0.6, 2)
    digests = []
    for ahead in (True, False):
        sim = Simulation([_fresh(r) for r in reqs], cfg, policy_for_test("fcfs"), ROOF,
                         acceptance=acc, check_every=1, draws_ahead=ahead)  # fmt: skip
        rec = sim.run()
        assert not sim.scheduler.draws_ahead
        assert sim.scheduler.num_drafted > 0
        digests.append(rec.digest())
    assert digests[0] == digests[1]


def _fresh(r: Request) -> Request:
    from horizon.workload.builder import fresh_copy

    return fresh_copy(r)


def _random_case(rng: random.Random):  # noqa: ANN202
    reqs = random_requests(rng, 40, rng.choice([20, 60, 200]), rng.choice([10, 40, 150]),
                           rate=rng.choice([20, 200]))  # fmt: skip
    k = rng.randint(1, 8)
    spec = rng.choice([
        SpeculationConfig(policy="fixed", num_draft_tokens=k),
        SpeculationConfig(policy="batch_limited", num_draft_tokens=k, max_batch=rng.randint(1, 6)),
    ])  # fmt: skip
    seqs = rng.randint(1, 12)
    cfg = SchedulerConfig(
        num_blocks=rng.randint(20, 400),
        block_size=rng.choice([1, 2, 4, 16]),
        max_num_seqs=seqs,
        max_num_batched_tokens=max(2, seqs + rng.randint(0, 60)),
        max_model_len=10_000,
        enable_prefix_caching=rng.random() < 0.7,
        speculation=spec,
    )
    policy = rng.choice(["fcfs", "memory_first", "vllm", "sjf_prompt", "horizon"])
    alpha = rng.choice([0.0, 0.3, 0.7, 0.9, 1.0])
    return reqs, cfg, policy, alpha, rng.random() < 0.5


def _pricing(rng: random.Random) -> tuple[VerifyCost, DraftCost]:
    """Either verification pricing (decode rows or chunks), with or without fitted host terms,
    and model-free or draft-model drafting costs."""
    host = rng.random() < 0.5
    verify = VerifyCost(
        shape=rng.choice(VERIFY_SHAPES),
        per_step_s=2e-4 if host else 0.0,
        per_verify_s=3e-6 if host else 0.0,
    )
    draft = rng.choice([
        DraftCost(),
        DraftCost("model", per_token_s=1e-6, per_position_s=4e-4, per_step_s=3e-4),
    ])  # fmt: skip
    return verify, draft


def _count_paths(monkeypatch) -> Counter:  # noqa: ANN001
    """Count the drawn mechanics' rarer paths: per-request steps, short of blocks, every
    track drawn again, tracks cut, tracked requests preempted."""
    seen: Counter = Counter()

    def spy(cls, name):  # noqa: ANN001, ANN202
        f = getattr(cls, name)

        def g(self, *a, **kw):  # noqa: ANN001, ANN202
            seen[name] += 1
            if name == "_careful" and a[1] > self.s.pool.num_free - self.s.ledger.outstanding:
                seen["short of blocks"] += 1
            if name == "_preempt" and self._drawn is not None:
                seen["tracked preempted"] += a[0].request_id in self._drawn.live
            return f(self, *a, **kw)

        monkeypatch.setattr(cls, name, g)

    for name in ("_careful", "_redraw_all", "_stop"):
        spy(DrawnSpeculation, name)
    spy(Scheduler, "_preempt")
    return seen


def test_drawn_and_per_step_runs_are_byte_identical(monkeypatch, scale):
    """Random workloads, pools from dry to ample, prefix caching on and off, block sizes 1-16,
    budgets that cap the drafts, reserving policies, fixed and batch-limited speculation,
    serial and engine loops: records, step rows, drafts, accepted drafts and tokens equal.
    At least 30 cases, more (up to 60) until every kind of case ran twice."""
    seen = _count_paths(monkeypatch)
    rng = random.Random(5)
    identical = 0
    kinds: Counter = Counter()

    def covered() -> bool:
        return len(kinds) == 6 and min(kinds.values()) >= 2 * scale

    while identical < 30 * scale or (not covered() and identical < 60 * scale):
        reqs, cfg, policy, alpha, pipe = _random_case(rng)
        verify, draft = _pricing(rng)
        cost = rng.choice([ROOF, FIT])
        kinds[verify.shape] += 1
        acc = AcceptanceModel.geometric(alpha, rng.randrange(1000))
        runs = []
        for ahead in (True, False):
            sim, rec = _simulate([_fresh(r) for r in reqs], cfg, policy, acc, cost, pipe, ahead,
                                 verify_cost=verify, draft_cost=draft)  # fmt: skip
            s = sim.scheduler
            runs.append((rec.digest(), s.num_drafted, s.num_accepted, s.tokens_emitted))
        assert runs[0] == runs[1], (cfg, policy, alpha, pipe, verify, draft)
        identical += 1
        kinds[("engine loop" if pipe else "serial loop")] += 1
        if cfg.enable_prefix_caching and rec.num_preemptions.sum():
            kinds["prefix caching, preempting"] += 1
        if cfg.speculation.policy == "batch_limited":
            kinds["batch_limited"] += 1
    assert covered(), kinds
    # every path of the drawn mechanics ran
    assert seen["_careful"] and seen["short of blocks"] and seen["_redraw_all"]
    assert seen["_stop"] and seen["tracked preempted"]


def test_draws_ahead_are_the_per_step_draws():
    """hits / hits_many at each position equal sample's draw there, for any k <= kmax."""
    rng = random.Random(3)
    for rates in [(0.7,), (0.9, 0.5, 0.3), (0.0,), (1.0,), (0.5, 1.0, 0.2)]:
        for seed in (0, 7, 2**40, 2**64 - 1):
            m = AcceptanceModel(rates, seed)
            ids = [rng.randrange(10**6) for _ in range(3)]
            lengths = [rng.randint(1, 300) for _ in ids]
            for kmax in (1, 4, 70):
                many = m.hits_many(ids, lengths, kmax)
                i = 0
                for rid, n in zip(ids, lengths):
                    one = m.hits(rid, 0, n, kmax)
                    assert np.array_equal(many[i : i + n], one)
                    i += n
                    for k in {1, max(1, kmax // 2), kmax}:
                        reqs = [_at(rid, g) for g in range(n)]
                        drawn = m.sample([(r, k) for r in reqs])
                        assert np.array_equal(np.minimum(one, k), drawn)


def _at(rid: int, g: int) -> SimpleNamespace:
    """What ``sample`` reads of a request at output position ``g``."""
    return SimpleNamespace(request_id=rid, num_output_tokens=g)


class _Shifted(ModelDraws):
    """A draw source whose draws ahead are one position off the per-step draws."""

    def draws(self, r, start, kmax):  # noqa: ANN001, ANN201
        base, hits = super().draws(r, start, kmax)
        return base, hits[1:] + hits[:1]


def test_draws_that_differ_from_the_per_step_draws_change_the_records(monkeypatch):
    """The comparison above fails when the draws ahead are not the per-step ones: the same
    run with a source one position off gives other records (and a source that keeps them
    passes)."""
    reqs = random_requests(random.Random(9), 60, 80, 80, rate=50)
    cfg = SchedulerConfig(num_blocks=2000, max_num_seqs=16, speculation=SpeculationConfig())
    acc = AcceptanceModel.geometric(0.7, 1)
    digests = {}
    for source in ("trace", "model", "shifted", None):

        def draws(a, rs, source=source):  # noqa: ANN001, ANN202
            if source == "model":
                return ModelDraws(a)
            return _Shifted(a) if source == "shifted" else TraceDraws(a, rs)

        monkeypatch.setattr("simulator.simulation.TraceDraws", draws)
        sim, rec = _simulate([_fresh(r) for r in reqs], cfg, "fcfs", acc, ROOF, False,
                             draws_ahead=source is not None)  # fmt: skip
        digests[source] = (rec.digest(), sim.scheduler.num_accepted)
    assert digests["trace"] == digests["model"] == digests[None]
    assert digests["shifted"] != digests[None]
