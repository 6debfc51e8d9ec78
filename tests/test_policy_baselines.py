"""The simple and production-style baselines: random, lpf, sjf_predicted, memory_first's cap, vllm.

Each test checks the decision that defines a policy, through the interface or the scheduler;
the configs are checked by composing them.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from sched_driver import ConstantCost, ExactOracle, random_requests

from experiments.config_store import register_configs
from experiments.policy_config import PolicyConfig
from horizon.model_shape import model_shape
from horizon.policies import make_policy
from horizon.policies.lpf import LongestPromptFirst
from horizon.policies.memory_first import MemoryFirst
from horizon.policies.random_order import RandomOrder
from horizon.policies.sjf_predicted import SJFPredicted
from horizon.policies.vllm import VLLM
from horizon.prediction import LengthDistribution
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from predictors import MeanPredictor
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.backend import SimBackend

REPO = Path(__file__).resolve().parents[1]
COST = make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))
PATHS = {
    "random": "horizon.policies.random_order:RandomOrder",
    "lpf": "horizon.policies.lpf:LongestPromptFirst",
    "sjf_predicted": "horizon.policies.sjf_predicted:SJFPredicted",
    "vllm": "horizon.policies.vllm:VLLM",
}


def _req(i: int, t: float, prompt: int = 10, out: int = 20, max_out: int = 2048) -> Request:
    return Request(i, t, prompt, max_out, out)


def _preempted_after(r: Request, emitted: int) -> Request:
    """``r`` after emitting ``emitted`` tokens and being preempted by recompute."""
    r.advance(r.num_prompt_tokens)
    for _ in range(emitted - 1):
        r.advance(1)
    r.reset_for_recompute(0)
    return r


def _order(policy, reqs: list[Request]) -> list[int]:
    return [r.request_id for r in sorted(reqs, key=lambda r: policy.waiting_key(r, 0.0))]


def _typed(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return OmegaConf.to_object(compose("run", overrides=list(overrides)))


# -- random ---------------------------------------------------------------------------------------
def test_random_order_depends_only_on_seed_and_request_id():
    reqs = [_req(i, 0.1 * i) for i in range(200)]
    keys = [RandomOrder(seed=3).waiting_key(r, 0.0) for r in reqs]
    random.seed(12345)  # what ran before in the process must not matter
    random.random()
    np.random.seed(7)
    late = [_req(i, 50.0 - 0.1 * i, prompt=1 + i) for i in range(200)]  # other times, sizes
    again = RandomOrder(seed=3)
    assert [again.waiting_key(r, 9.0) for r in reversed(late)] == keys[::-1]
    order = _order(RandomOrder(seed=3), reqs)
    assert sorted(order) == list(range(200))
    rho = np.corrcoef(order, range(200))[0, 1]
    assert abs(rho) < 0.2  # a shuffle, not the arrival order or its reverse
    assert _order(RandomOrder(seed=4), reqs) != order


def test_random_order_is_the_same_in_a_fresh_process():
    code = (
        "from horizon.policies.random_order import RandomOrder\n"
        "from horizon.request import Request\n"
        "p = RandomOrder(seed=5)\n"
        "print([p.waiting_key(Request(i, 0.0, 1, 1, 1), 0.0)[0] for i in range(8)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "99", "PATH": ""},
        cwd=REPO,
    ).stdout
    here = RandomOrder(seed=5)
    assert out.strip() == str([here.waiting_key(_req(i, 0.0), 0.0)[0] for i in range(8)])


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_random_order_rejects_a_bad_seed(seed):
    with pytest.raises(ValueError, match="random.seed must be an int >= 0"):
        RandomOrder(seed=seed)


# -- lpf ------------------------------------------------------------------------------------------
def test_lpf_orders_by_prompt_length_descending_then_arrival():
    reqs = [_req(0, 0.0, prompt=5), _req(1, 1.0, prompt=50), _req(2, 2.0, prompt=20)]
    reqs.append(_req(3, 0.5, prompt=50))
    assert _order(LongestPromptFirst(), reqs) == [3, 1, 2, 0]
    running = reqs[:3]
    assert LongestPromptFirst().choose_victim(running, running[1], 0.0) is reqs[0]


def test_lpf_admits_the_longest_waiting_prompt_when_a_seat_frees():
    cfg = SchedulerConfig(num_blocks=100, max_num_seqs=1, max_num_batched_tokens=64)
    reqs = [_req(i, 0.01 * i, p, out=2, max_out=4) for i, p in enumerate([8, 3, 30, 12, 30])]
    sched = Scheduler(cfg, LongestPromptFirst())
    for r in reqs:
        sched.add(r)
    backend = SimBackend(ConstantCost(), event_mode=True)
    now, admitted = 0.0, []
    while sched.has_work:
        plan = sched.schedule(now)
        admitted += [r.request_id for r in sched.running.values() if r.request_id not in admitted]
        now += 0.01
        sched.update(plan, backend.execute(plan), now)
    assert admitted == [2, 4, 3, 0, 1]


# -- sjf_predicted --------------------------------------------------------------------------------
class _ByRequest:
    """A predictor with a given total-length distribution per request id."""

    name = "by_request"
    reads_true_length = False

    def __init__(self, dists: dict[int, LengthDistribution]) -> None:
        self.dists = dists

    def predict(self, r: Request) -> LengthDistribution:
        return self.dists[r.request_id]

    def update(self, r: Request, g: int) -> LengthDistribution:
        return self.predict(r).remaining(g)


def test_sjf_predicted_orders_by_the_median_not_the_mean():
    skewed = LengthDistribution((0.25, 0.5, 0.75), (5.0, 10.0, 900.0), 1.0, 1000.0)
    steady = LengthDistribution((0.25, 0.5, 0.75), (45.0, 50.0, 55.0), 1.0, 60.0)
    assert skewed.mean > steady.mean
    policy = SJFPredicted(_ByRequest({0: steady, 1: skewed}), aging_tokens_per_s=0.0)
    assert _order(policy, [_req(0, 0.0), _req(1, 0.0)]) == [1, 0]


def test_sjf_predicted_aging_bounds_the_wait():
    policy = SJFPredicted(ExactOracle(), aging_tokens_per_s=100.0)
    old = _req(0, 0.0, out=300)  # waited 1 s longer: worth 100 predicted tokens
    assert _order(policy, [old, _req(1, 1.0, out=201)]) == [0, 1]
    assert _order(policy, [old, _req(2, 1.0, out=199)]) == [2, 0]


def test_sjf_predicted_keys_a_preempted_request_by_what_it_has_left():
    policy = SJFPredicted(ExactOracle(), aging_tokens_per_s=0.0)
    fresh, resumed = _req(0, 0.0, out=20), _req(1, 0.0, out=100)
    assert _order(policy, [fresh, resumed]) == [0, 1]
    _preempted_after(resumed, 90)  # 10 of its 100 tokens left
    assert _order(policy, [fresh, resumed]) == [1, 0]
    assert policy.reads_true_length  # it reads the true length through the oracle


def test_sjf_predicted_preempts_the_longest_queued_key():
    policy = SJFPredicted(ExactOracle(), aging_tokens_per_s=0.0)
    running = [_req(0, 0.0, out=50), _req(1, 1.0, out=400), _req(2, 2.0, out=10)]
    for i, r in enumerate(running):
        policy.waiting_key(r, 0.0)
        r.admit_seq = i
    assert policy.choose_victim(running, running[2], 3.0) is running[1]


def test_sjf_predicted_needs_a_predictor():
    with pytest.raises(ValueError, match="needs a predictor"):
        PolicyConfig(name=PATHS["sjf_predicted"])
    with pytest.raises(ValueError, match="aging_tokens_per_s must be finite and >= 0"):
        SJFPredicted(ExactOracle(), aging_tokens_per_s=-1.0)


# -- memory_first ---------------------------------------------------------------------------------
def test_memory_first_without_a_predictor_reserves_max_output_tokens():
    policy = MemoryFirst()
    assert policy.reservation["min_output_tokens"] is None
    assert policy.reserve_tokens(_req(0, 0.0, prompt=30, max_out=2048)) == 30 + 2048
    assert policy.reservation == {
        "output_cap": "max_output_tokens",
        "min_output_tokens": 2048,
        "max_output_tokens": 2048,
    }


def test_memory_first_caps_at_the_training_quantile_never_above_max_output_tokens():
    train = [_req(i, 0.0, out=o, max_out=2048) for i, o in enumerate(range(1, 1001))]
    policy = MemoryFirst(MeanPredictor().fit(train), quantile=0.99)
    cap = math.ceil(np.quantile(np.arange(1, 1001), 0.99))  # 990.01 -> 991
    assert policy.reserve_tokens(_req(5000, 0.0, prompt=40, max_out=2048)) == 40 + cap
    assert policy.reserve_tokens(_req(5001, 0.0, prompt=40, max_out=500)) == 40 + 500
    assert policy.reservation == {
        "output_cap": "q0.99",
        "min_output_tokens": 500,
        "max_output_tokens": cap,
    }
    resumed = _preempted_after(_req(5002, 0.0, out=1500, max_out=2048), 995)  # past the cap
    assert 995 < policy.output_cap(resumed) <= 2048  # what it emitted plus what it has left


def test_memory_first_cap_admits_more_at_once_than_the_worst_case():
    cfg = SchedulerConfig(num_blocks=200, block_size=4, max_num_seqs=64, max_num_batched_tokens=256)
    train = random_requests(random.Random(1), 300, max_prompt=30, max_output=40)
    runs = {}
    for name, policy in (
        ("worst", MemoryFirst()),
        ("q99", MemoryFirst(MeanPredictor().fit(train), quantile=0.99)),
    ):
        reqs = [
            Request(r.request_id, 0.0, r.num_prompt_tokens, 400, r.true_output_tokens)
            for r in random_requests(random.Random(2), 200, max_prompt=30, max_output=40)
        ]
        runs[name] = Simulation(reqs, cfg, policy, COST).run()
    assert runs["worst"].num_preemptions.sum() == 0
    for rec in runs.values():
        assert (rec.status == 0).all()  # all finished
    assert runs["q99"].num_running.max() >= 3 * runs["worst"].num_running.max()
    assert runs["q99"].step_end.max() < 0.5 * runs["worst"].step_end.max()


@pytest.mark.parametrize("q", [0.0, 1.5, True])
def test_memory_first_quantile_is_checked(q):
    with pytest.raises(ValueError, match=r"memory_first.quantile must be in \(0, 1\]"):
        MemoryFirst(ExactOracle(), quantile=q)


# -- vllm -----------------------------------------------------------------------------------------
def _burst_steps(policy, reqs: list[Request], cfg: SchedulerConfig) -> list[tuple[int, int]]:
    """All of ``reqs`` queued at once, run to completion at 10 ms a step; per step, how many
    requests were admitted and how many preempted."""
    sched = Scheduler(cfg, policy)
    for r in reqs:
        sched.add(r)
    backend = SimBackend(ConstantCost(), event_mode=cfg.step_mode == "event")
    now, steps = 0.0, []
    while sched.has_work:
        seq = max(r.admit_seq for r in reqs)
        plan = sched.schedule(now)
        steps.append((sum(r.admit_seq > seq for r in reqs), len(plan.preempted)))
        result = backend.execute(plan)
        now += 0.01
        sched.update(plan, result, now)
    sched.check_integrity()
    return steps


SMALL_POOL = SchedulerConfig(
    num_blocks=24, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1000
)


def test_vllm_preempts_the_latest_admitted_and_in_priority_mode_the_latest_arrival():
    early, late = _req(0, 0.0), _req(1, 5.0)
    late.admit_seq, early.admit_seq = 3, 7  # early was preempted and readmitted after late
    assert VLLM().choose_victim([late, early], late, 9.0) is early
    assert VLLM(mode="priority").choose_victim([late, early], late, 9.0) is late


def test_vllm_puts_preempted_requests_at_the_head_latest_first():
    policy = VLLM()
    new = [_req(i, float(i)) for i in range(3)]
    first, second = _preempted_after(_req(10, 8.0), 3), _preempted_after(_req(11, 9.0), 3)
    keys = {r.request_id: policy.waiting_key(r, 10.0) for r in [*new, first, second]}
    assert sorted(keys, key=keys.__getitem__) == [11, 10, 0, 1, 2]
    prio = VLLM(mode="priority")  # a heap on (priority 0, arrival): no head for the preempted
    assert _order(prio, [*new, first, second]) == [0, 1, 2, 10, 11]


def test_vllm_admits_nothing_in_a_step_that_preempted():
    both = {"fcfs": 0, "vllm": 0}
    for seed in range(4):
        for name, policy in (("fcfs", make_policy("fcfs")), ("vllm", VLLM())):
            reqs = random_requests(random.Random(seed), 30, max_prompt=40, max_output=30)
            steps = _burst_steps(policy, reqs, SMALL_POOL)
            assert sum(p > 0 for _, p in steps) > 5  # the pool really runs dry
            both[name] += sum(a > 0 and p > 0 for a, p in steps)
    assert both["vllm"] == 0
    assert both["fcfs"] > 0  # the scheduler alone would admit in such steps


def test_vllm_mode_is_checked():
    with pytest.raises(ValueError, match="vllm.mode must be one of fcfs, priority"):
        VLLM(mode="lifo")


def test_vllm_scheduler_preset_holds_the_h200_api_server_defaults():
    cfg = _typed("policy=vllm", f"policy.name={PATHS['vllm']}", "scheduler=vllm")
    s = cfg.scheduler
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.block_size) == (8192, 1024, 16)
    assert s.enable_prefix_caching and cfg.policy.options == {"mode": "fcfs"}


# -- every new policy -----------------------------------------------------------------------------
def _short_mean() -> MeanPredictor:
    return MeanPredictor().fit(random_requests(random.Random(0), 50, max_prompt=40, max_output=8))


@pytest.mark.parametrize(
    "make",
    [
        lambda: VLLM(),
        lambda: VLLM(mode="priority"),
        lambda: RandomOrder(seed=1),
        lambda: LongestPromptFirst(),
        lambda: SJFPredicted(ExactOracle()),
        lambda: MemoryFirst(_short_mean(), quantile=0.5),  # caps too low: preempts
    ],
)
def test_event_and_reference_modes_give_identical_records(make):
    digests = []
    for mode in ("event", "reference"):
        cfg = SchedulerConfig(
            num_blocks=40, block_size=4, max_num_seqs=8, max_num_batched_tokens=64, step_mode=mode
        )
        reqs = random_requests(random.Random(3), 60, max_prompt=40, max_output=40, rate=200.0)
        rec = Simulation(reqs, cfg, make(), COST, check_every=7).run()
        rec.check()
        assert rec.num_preemptions.sum() > 0
        digests.append(rec.digest())
    assert digests[0] == digests[1]


# -- configs --------------------------------------------------------------------------------------
def test_memory_first_configs_with_and_without_the_cap():
    plain = _typed("policy=memory_first").policy
    assert (plain.options, plain.predictor) == ({}, None)
    q99 = _typed("policy=memory_first_q99").policy
    assert q99.options == {"quantile": 0.99}
    assert q99.predictor_config.name == "mean" and q99.predictor_config.learns
    assert q99.label == "memory_first(quantile=0.99)[mean]"


def test_new_policy_configs_compose_with_their_options():
    def policy(option: str) -> PolicyConfig:
        return _typed(f"policy={option}", f"policy.name={PATHS[option]}").policy

    assert policy("random").options == {"seed": 0}
    assert policy("lpf").options == {}
    assert policy("vllm").options == {"mode": "fcfs"}
    sjf = policy("sjf_predicted")
    assert sjf.options == {"aging_tokens_per_s": 100.0}
    assert sjf.predictor == _typed("policy=horizon").policy.predictor  # the same learned model
