"""A tiny step loop over the Scheduler for tests: no SimPy, a constant step time."""

from __future__ import annotations

import random
from dataclasses import dataclass

from horizon.metrics.records import RunRecords
from horizon.plan import StepPlan
from horizon.policies import Policy, make_policy
from horizon.policies.registry import POLICIES
from horizon.prediction import LengthDistribution
from horizon.registry import requires
from horizon.request import Request
from horizon.scheduler import Scheduler
from horizon.scheduler_config import SchedulerConfig
from simulator.backend import SimBackend


class ExactOracle:
    """A point-mass predictor of the true length (reads it: an oracle, for tests)."""

    name = "test_oracle"
    reads_true_length = True

    def predict(self, r: Request) -> LengthDistribution:
        t = float(r.true_output_tokens)
        return LengthDistribution((0.5,), (t,), t, t)

    def update(self, r: Request, tokens_so_far: int) -> LengthDistribution:
        return self.predict(r).remaining(tokens_so_far)


def policy_for_test(name: str) -> Policy:
    """Any registered policy; one that needs a predictor gets the exact oracle (no trained
    model needed), ``horizon`` with a short refresh."""
    if name == "horizon":
        return make_policy(name, predictor=ExactOracle(), refresh_every=4, ttft_slo=0.5)
    if requires(POLICIES.resolve(name), "predictor"):
        return make_policy(name, predictor=ExactOracle())
    return make_policy(name)


@dataclass(frozen=True)
class ConstantCost:
    seconds: float = 0.01

    def step_time(self, plan: StepPlan) -> float:
        return self.seconds if not plan.is_empty else 0.0


def random_requests(
    rng: random.Random, n: int, max_prompt: int, max_output: int, rate: float = 50.0
) -> list[Request]:
    """Requests whose prompts share prefixes drawn from a few families (prefix caching)."""
    families = [[rng.randrange(1000) for _ in range(max_prompt)] for _ in range(3)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        p = rng.randint(1, max_prompt)
        fam = rng.choice(families)
        shared = rng.randint(0, p)
        ids = tuple(fam[:shared]) + tuple(rng.randrange(1000) for _ in range(p - shared))
        o = rng.randint(1, max_output)
        out.append(Request(i, t, p, max_output, o, prompt_token_ids=ids))
    return out


def drive(
    requests: list[Request], config: SchedulerConfig, policy: str, check: bool = True
) -> tuple[Scheduler, RunRecords, int]:
    """Run to completion; returns the scheduler, its records and the number of operations
    (adds + steps), calling check_integrity() after each if ``check``."""
    sched = Scheduler(config, policy_for_test(policy))
    backend = SimBackend(ConstantCost(), event_mode=config.step_mode == "event")
    pending = sorted(requests, key=lambda r: r.arrival_time)
    now, i, ops = 0.0, 0, 0
    while i < len(pending) or sched.has_work:
        while i < len(pending) and pending[i].arrival_time <= now:
            sched.add(pending[i])
            i += 1
            ops += 1
        if not sched.has_work:
            if i < len(pending):
                now = pending[i].arrival_time
            continue
        plan = sched.schedule(now)
        result = backend.execute(plan)
        now += result.duration if result.duration else 0.001
        sched.update(plan, result, now)
        ops += 1
        if check:
            sched.check_integrity()
        assert ops < 200_000, "no progress"
    sched.finish_run()
    sched.check_integrity()
    return sched, sched.recorder.build(), ops
