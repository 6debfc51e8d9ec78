"""``Simulation(pipelined=True)``: the engine's pipelined loop (a step planned while the one
before it runs) in simulated time."""

from __future__ import annotations

import numpy as np
import pytest

from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator import Simulation


class FixedCost:
    """Every non-empty step takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_time(self, plan) -> float:  # noqa: ANN001
        return 0.0 if plan.is_empty else self.seconds


def _run(requests: list[Request], pipelined: bool, cost: float = 1.0, **cfg):  # noqa: ANN003
    config = SchedulerConfig(num_blocks=cfg.pop("num_blocks", 64), block_size=4, **cfg)
    sim = Simulation(
        requests,
        config,
        make_policy("fcfs"),
        FixedCost(cost),
        check_every=1,
        arrivals_at_step_boundaries=True,
        pipelined=pipelined,
    )
    return sim.run()


def _requests(arrivals: list[float], outputs: list[int], prompt: int = 8) -> list[Request]:
    return [Request(i, t, prompt, 64, o) for i, (t, o) in enumerate(zip(arrivals, outputs))]


def test_offline_runs_have_the_serial_plans_and_token_times():
    """All requests queued at the start: nothing arrives to be seen late, so the pipelined loop
    plans the same steps, and with no host time between steps they end at the same times; only
    the planning times (step starts) move earlier."""
    reqs = lambda: _requests([0.0] * 6, [5, 9, 3, 12, 7, 4], prompt=10)  # noqa: E731
    serial = _run(reqs(), False, max_num_batched_tokens=16, max_num_seqs=4)
    piped = _run(reqs(), True, max_num_batched_tokens=16, max_num_seqs=4)
    piped.check()
    for name in ("prefill_tokens", "decode_tokens", "step_end", "token_times"):
        np.testing.assert_array_equal(getattr(piped, name), getattr(serial, name), err_msg=name)
    assert np.all(piped.step_start[1:] < piped.step_end[:-1])  # planned while the last one ran
    np.testing.assert_allclose(piped.step_durations(), 1.0)


def test_an_arrival_reaches_the_gpu_one_step_later():
    """Steps of 1 s; B arrives at 0.5 during step 0. Serially it is planned at 1.0 and emits at
    2.0; pipelined, the plan made at 0.0 (step 1) missed it and the one made at 1.0 runs from
    2.0, so B emits at 3.0."""
    reqs = lambda: _requests([0.0, 0.5], [6, 2])  # noqa: E731
    serial = _run(reqs(), False)
    piped = _run(reqs(), True)
    first = lambda rec: rec.token_times[rec.token_offsets[:-1]]  # noqa: E731
    assert first(serial).tolist() == [1.0, 2.0]
    assert first(piped).tolist() == [1.0, 3.0]
    assert piped.step_end[-1] == pytest.approx(serial.step_end[-1])  # A bounds the run


def test_idle_then_busy_again():
    """After an idle gap the engine plans at once (nothing in flight)."""
    reqs = lambda: _requests([0.0, 10.0], [3, 3])  # noqa: E731
    piped = _run(reqs(), True)
    piped.check()
    first = piped.token_times[piped.token_offsets[:-1]]
    assert first.tolist() == [1.0, 11.0]
    assert (piped.status == 0).all()
