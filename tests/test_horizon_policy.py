"""The horizon policy: expected pool-use admission, goodput tiers, online refresh."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sched_driver import ExactOracle

from horizon.metrics import summarize
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.prediction import LengthDistribution
from horizon.request import SLO, Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import WorkloadConfig, build_workload
from simulator import Simulation, gpu_spec, make_cost_model

COST = make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))
SLO_7B = SLO(1.0, 0.05)


class Constant:
    """Every request gets the same total-length distribution (an uninformed predictor)."""

    name = "constant"
    reads_true_length = False

    def __init__(self, lengths: np.ndarray) -> None:
        levels = tuple(float(q) for q in np.arange(0.05, 1.0, 0.05))
        vals = tuple(float(np.quantile(lengths, q)) for q in levels)
        self.dist = LengthDistribution(levels, vals, 1.0, float(lengths.max()))

    def predict(self, r: Request) -> LengthDistribution:
        return self.dist

    def update(self, r: Request, g: int) -> LengthDistribution:
        return self.dist.remaining(g)


def _run(tokenized, policy, rate, n=400, num_blocks=500, seed=0):
    wl = build_workload(WorkloadConfig(num_requests=n, rate=rate, seed=seed), tokenized)
    sim = Simulation(wl.new_requests(), SchedulerConfig(num_blocks=num_blocks), policy, COST)
    rec = sim.run()
    return wl, rec, summarize(rec, SLO_7B)


def test_exact_predictions_never_preempt_where_fcfs_does(sharegpt_head):
    wl, fcfs, _ = _run(sharegpt_head, make_policy("fcfs"), rate=60.0)
    assert fcfs.num_preemptions.sum() > 50
    hz = make_policy("horizon", predictor=ExactOracle(), ttft_slo=1.0)
    _, rec, _ = _run(sharegpt_head, hz, rate=60.0)
    assert rec.num_preemptions.sum() == 0
    assert (rec.status == 0).all()
    assert hz.num_refreshes > 10


def test_goodput_beats_fcfs_under_kv_pressure_even_with_an_uninformed_predictor(sharegpt_head):
    wl, _, s_fcfs = _run(sharegpt_head, make_policy("fcfs"), rate=60.0)
    lengths = np.array([r.true_output_tokens for r in wl.requests])
    hz = make_policy("horizon", predictor=Constant(lengths), ttft_slo=1.0)
    _, rec, s_hz = _run(sharegpt_head, hz, rate=60.0)
    assert s_fcfs["goodput_lifetime"] < 0.8  # the setting really is KV-bound for fcfs
    assert s_hz["goodput_lifetime"] >= 1.3 * s_fcfs["goodput_lifetime"]
    assert s_hz["recompute_waste"] < 0.6 * s_fcfs["recompute_waste"]
    assert s_hz["throughput_tok_s"] >= 0.95 * s_fcfs["throughput_tok_s"]


def test_waiting_order_tiers():
    hz = make_policy("horizon", predictor=ExactOracle(), ttft_slo=1.0, max_wait_s=10.0)
    fresh = Request(0, 10.0, 10, 100, 50)
    late = Request(1, 3.0, 10, 100, 50)
    starving = Request(2, 0.0, 10, 100, 50)
    now = 10.5
    keys = {r.request_id: hz.waiting_key(r, now) for r in (fresh, late, starving)}
    assert keys[2] < keys[0] < keys[1]  # starving first, then TTFT-feasible, then doomed


class _View:
    """The part of a KVView that refresh and rank_waiting read: an empty pool at ``step``."""

    def __init__(self, num_blocks: int, step: int) -> None:
        self.num_blocks, self.block_size, self.step = num_blocks, 16, step
        self.running: tuple[Request, ...] = ()
        self.num_running = 0


def _ranked(num_blocks: int, waiting: list[Request], now: float, triage: bool = True):
    hz = make_policy("horizon", predictor=ExactOracle(), ttft_slo=1.0, triage=triage)
    # two refreshes 16 steps and 0.16 s apart: 10 ms per step
    hz.refresh(_View(num_blocks, 0), now - 0.16)
    hz.refresh(_View(num_blocks, 16), now)
    assert hz.step_time() == pytest.approx(0.01)
    return hz, hz.rank_waiting(waiting, _View(num_blocks, 16), now)


def test_triage_keeps_a_queue_that_fits_in_deadline_order():
    waiting = [Request(i, 0.1 * i, 200, 400, 100) for i in range(5)]
    hz, keys = _ranked(1000, waiting, now=0.5)
    assert keys == [hz.waiting_key(r, 0.5) for r in waiting]
    assert hz.num_triaged == 0


def test_triage_moves_the_largest_requests_that_would_start_late_behind_the_rest():
    # 100 blocks: 1,520 tokens below the headroom, ~120k token-steps before the deadlines (~80
    # steps). A 1,000-token prompt with 100 tokens to go needs ~105k token-steps, a 100-token
    # one ~16k. The big ones are older: deadline order would start them first, and only two
    # would start in time, the small ones after them late. Triage keeps the small ones instead.
    big = [Request(10 + i, 0.0, 1000, 1400, 100) for i in range(3)]
    small = [Request(i, 0.05, 100, 400, 100) for i in range(6)]
    waiting = small + big
    hz, keys = _ranked(100, waiting, now=0.2)
    tier = {r.request_id: k[0] for r, k in zip(waiting, keys)}
    assert [tier[r.request_id] for r in small] == [1] * 6
    assert [tier[r.request_id] for r in big] == [2, 2, 2]
    assert hz.num_triaged == 3
    # set aside, they still come before a request whose deadline has passed (it cannot be good)
    late = Request(99, 0.0, 100, 400, 100)
    shifted = [Request(r.request_id, r.arrival_time + 1.5, 100 if r in small else 1000,
                       r.max_output_tokens, 100) for r in waiting]  # fmt: skip
    hz, keys = _ranked(100, [*shifted, late], now=1.7)  # late: 1.7 s in the queue, TTFT 1 s
    order = [r.request_id for _, r in sorted(zip(keys, [*shifted, late]), key=lambda kr: kr[0])]
    assert order[-1] == 99 and set(order[6:9]) == {10, 11, 12}
    _, untouched = _ranked(100, waiting, now=0.2, triage=False)
    assert all(k[0] == 1 for k in untouched)


def test_triage_raises_goodput_in_an_overload_without_breaking_the_wait_bound(sharegpt_head):
    runs = {}
    for triage in (False, True):
        hz = make_policy("horizon", predictor=ExactOracle(), ttft_slo=1.0, triage=triage)
        _, rec, s = _run(sharegpt_head, hz, rate=90.0)
        runs[triage] = (hz, s)
    (_, s_edf), (hz, s_tri) = runs[False], runs[True]
    assert s_edf["goodput_lifetime"] < 0.5  # an overload: deadline order starts most late
    assert s_tri["goodput_lifetime"] >= 1.5 * s_edf["goodput_lifetime"]
    assert hz.num_triaged > 0
    assert s_tri["queue_wait_max"] <= hz.max_wait_s


def test_bad_knobs_are_named():
    for kwargs, field in [
        (dict(headroom=1.0), "headroom"),
        (dict(refresh_every=0), "refresh_every"),
        (dict(max_wait_s=math.nan), "max_wait_s"),
        (dict(ttft_slo=-1.0), "ttft_slo"),
        (dict(grid_step=0), "grid_step"),
        (dict(triage="yes"), "triage"),
    ]:
        with pytest.raises(ValueError, match=f"horizon.{field}"):
            make_policy("horizon", predictor=ExactOracle(), **kwargs)


def test_length_distribution_conditioning():
    d = LengthDistribution((0.1, 0.5, 0.9), (20.0, 100.0, 400.0), 1.0, 2048.0)
    assert d.quantile(0.5) == 100.0 and d.cdf(100.0) == 0.5
    rem = d.remaining(100)
    # conditional median: F^-1(0.5 + 0.5 * 0.5) - 100 = quantile(0.75) - 100
    assert rem.median == pytest.approx(d.quantile(0.75) - 100)
    assert rem.remaining_quantile(0, 0.9) == rem.quantile(0.9)
    assert d.remaining_quantile(100, 0.9) == pytest.approx(rem.quantile(0.9))
    point = LengthDistribution((0.5,), (70.0,), 70.0, 70.0).remaining(30)
    assert point.cdf(39.9) == 0.0 and point.cdf(40.0) == 1.0
    with pytest.raises(ValueError, match="levels"):
        LengthDistribution((0.5, 0.4), (1.0, 2.0))


def test_a_ranking_with_the_wrong_number_of_keys_is_refused():
    from sched_driver import ConstantCost

    from horizon.scheduler import Scheduler
    from simulator.backend import SimBackend

    class Short(type(make_policy("fcfs"))):
        refresh_every = 1
        dynamic_order = True

        def rank_waiting(self, waiting, view, now):
            return []

    sched = Scheduler(SchedulerConfig(num_blocks=4, max_num_seqs=1), Short())
    for i in range(2):
        sched.add(Request(i, 0.0, 8, 8, 8))
    backend, now = SimBackend(ConstantCost()), 0.0
    plan = sched.schedule(now)  # admits one; the other waits
    sched.update(plan, backend.execute(plan), now + 0.01)
    with pytest.raises(RuntimeError, match="rank_waiting returned 0 keys for 1 waiting"):
        sched.schedule(now + 0.01)


def test_check_integrity_catches_a_corrupt_state():
    hz, _ = _ranked(100, [Request(i, 0.0, 100, 400, 100) for i in range(3)], now=0.2)
    hz.check_integrity()
    hz._use[3] = -5.0
    with pytest.raises(AssertionError, match="below 0"):
        hz.check_integrity()


def test_eviction_takes_a_request_that_can_no_longer_be_good_first():
    """A request admitted after its TTFT deadline, or one already preempted after its first
    token, costs no goodput to evict: it goes before a request that can still be good, even one
    with more predicted work left per token computed."""
    hz, _ = _ranked(1000, [], now=2.0)  # refreshed at step 16, t = 2.0 s, 10 ms per step
    view = _View(1000, 16)
    good = Request(0, 1.9, 50, 900, 800)  # 0.1 s in the queue: can still meet its 1 s TTFT
    late = Request(1, 0.5, 50, 900, 100)  # 1.5 s in the queue: its first token is late
    for r in (good, late):
        assert hz.admit(r, view)
        r.admit_seq = r.request_id
    # remaining work per token computed alone would pick `good` (800 tokens left against 100)
    assert hz.choose_victim([good, late], good, 2.0) is late
    fresh = Request(2, 1.95, 50, 900, 100)
    assert hz.admit(fresh, view)
    fresh.admit_seq = 2
    assert hz.choose_victim([good, fresh], good, 2.0) is good  # neither lost: most work left
    # a request preempted after its first token has a broken gap: next time it goes first
    hz2, _ = _ranked(1000, [], now=2.0)
    a, c = Request(3, 1.9, 50, 1800, 800), Request(4, 1.9, 50, 1800, 1500)
    for i, r in enumerate((a, c)):
        assert hz2.admit(r, view)
        r.admit_seq = i
        r.advance(r.num_tokens_to_compute)  # prefill done: first token out
    assert hz2.choose_victim([a], a, 2.0) is a  # preempted (alone) with a token out
    assert hz2.choose_victim([a, c], c, 2.0) is a  # c has more work left, but a is lost
    hz2.check_integrity()
