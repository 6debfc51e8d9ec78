"""The engine replays arrivals on the wall clock (tiny model on the CPU)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_engine_offline import PROMPTS, dense_greedy, engine, make_requests, one_thread  # noqa: F401

from executor.engine import Engine, EngineConfig
from horizon.request import Request


@pytest.fixture(scope="module")
def model():
    from test_engine_offline import make_model

    return make_model()


def test_online_replays_arrivals_in_order(model):
    arrivals = [0.0, 0.04, 0.08, 0.12, 0.2, 0.2, 0.3, 0.35]
    outputs = [4, 3, 5, 2, 4, 4, 3, 2]
    e = engine(model, max_num_seqs=8, max_num_batched_tokens=64)
    e.warmup()
    start = time.perf_counter()
    rec = e.run_online(make_requests(outputs=outputs, arrivals=arrivals))
    wall = time.perf_counter() - start
    rec.check()
    np.testing.assert_array_equal(rec.arrival_time, arrivals)  # as given
    first = np.array([rec.tokens_of(i)[0] for i in range(rec.num_requests)])
    assert np.all(first >= rec.arrival_time)  # nobody starts before it arrives
    assert np.all(rec.first_admit_time >= rec.arrival_time)
    assert np.all(np.diff(first[[0, 1, 2, 3, 4, 6, 7]]) > 0)  # FCFS: first tokens in arrival order
    assert wall >= arrivals[-1]
    assert (rec.status == 0).all()
    for i, (p, n) in enumerate(zip(PROMPTS, outputs)):
        assert e.outputs[i] == dense_greedy(model, p, n)


def test_online_idles_between_sparse_arrivals(model):
    """With gaps longer than a request, the engine sleeps and each request runs alone."""
    arrivals = [0.0, 0.15, 0.3]
    e = engine(model)
    rec = e.run_online(make_requests(PROMPTS[:3], [3, 3, 3], arrivals))
    assert rec.num_running.max() == 1
    idle = rec.step_start[1:] - rec.step_end[:-1]
    assert idle.max() > 0.05  # it waited for the next arrival rather than spinning steps


def test_max_time_cuts_the_run(model):
    reqs = [Request(i, t, 8, 240, 240) for i, t in enumerate([0.0, 0.01, 5.0])]
    cfg = EngineConfig(
        num_blocks=200, block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256
    )
    e = Engine(model, cfg)
    start = time.perf_counter()
    rec = e.run_online(reqs, max_time=0.15)
    assert time.perf_counter() - start < 2.0
    assert rec.num_requests == 2  # the 5 s arrival is not part of the run
    assert (rec.status == 2).all() and rec.num_output_tokens.sum() > 0  # cut off, unfinished
    assert [len(e.outputs[i]) for i in range(2)] == list(rec.num_output_tokens)
