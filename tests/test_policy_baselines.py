"""The simple and production-style baselines: random and lpf.

Each test checks the decision that defines a policy, through the interface or the scheduler;
the configs are checked by composing them.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from sched_driver import ConstantCost, random_requests

from experiments.config_store import register_configs
from experiments.policy_config import PolicyConfig
from horizon.model_shape import model_shape
from horizon.policies.lpf import LongestPromptFirst
from horizon.policies.random_order import RandomOrder
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation, gpu_spec, make_cost_model
from simulator.backend import SimBackend

REPO = Path(__file__).resolve().parents[1]
COST = make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))
PATHS = {
    "random": "horizon.policies.random_order:RandomOrder",
    "lpf": "horizon.policies.lpf:LongestPromptFirst",
}


def _req(i: int, t: float, prompt: int = 10, out: int = 20, max_out: int = 2048) -> Request:
    return Request(i, t, prompt, max_out, out)


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


# -- every new policy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomOrder(seed=1),
        lambda: LongestPromptFirst(),
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
def test_new_policy_configs_compose_with_their_options():
    def policy(option: str) -> PolicyConfig:
        return _typed(f"policy={option}", f"policy.name={PATHS[option]}").policy

    assert policy("random").options == {"seed": 0}
    assert policy("lpf").options == {}
