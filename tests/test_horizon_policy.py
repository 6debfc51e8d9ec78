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


def test_bad_knobs_are_named():
    for kwargs, field in [
        (dict(headroom=1.0), "headroom"),
        (dict(refresh_every=0), "refresh_every"),
        (dict(max_wait_s=math.nan), "max_wait_s"),
        (dict(ttft_slo=-1.0), "ttft_slo"),
        (dict(grid_step=0), "grid_step"),
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
