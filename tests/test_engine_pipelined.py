"""The pipelined engine loop (``EngineConfig.async_steps``) and the runner's submit/wait split:
a step is queued before the previous one's tokens are read, and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest
from test_engine_offline import engine, make_model, make_requests, one_thread  # noqa: F401

from executor.sampling import SamplingParams
from horizon.plan import StepPlan
from horizon.request import Request

SAME = ("prefill_tokens", "decode_tokens", "kv_used_blocks", "num_preemptions", "computed_tokens")


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.mark.parametrize(
    "kw",
    [
        {},  # roomy
        {"num_blocks": 16},  # preemptions and recompute
        {"num_blocks": 16, "sampling": SamplingParams(temperature=1.0, top_k=50)},
        {"max_num_batched_tokens": 128, "max_num_seqs": 8},  # many finish in one step
    ],
    ids=["roomy", "preempting", "sampled", "wide"],
)
def test_pipelined_runs_are_the_serial_runs(model, kw):
    serial = engine(model, async_steps=False, **kw)
    rs = serial.run_offline(make_requests())
    piped = engine(model, async_steps=True, **kw)
    rp = piped.run_offline(make_requests())
    rp.check()
    assert piped.outputs == serial.outputs
    for name in SAME:
        np.testing.assert_array_equal(getattr(rp, name), getattr(rs, name), err_msg=name)
    if "num_blocks" in kw:
        assert rp.num_preemptions.sum() > 0


def test_pipelined_steps_overlap_and_their_durations_do_not(model):
    """A step is planned before the previous one's tokens are read: its start precedes that
    step's end, and ``step_durations`` counts the overlap once."""
    e = engine(model)
    rec = e.run_offline(make_requests())
    assert e.config.pipelined  # the default with stop="trace"
    overlap = rec.step_start[1:] < rec.step_end[:-1]
    assert overlap.mean() > 0.5
    d = rec.step_durations()
    assert np.all(d >= 0)
    assert d.sum() == pytest.approx(rec.step_end[-1] - rec.step_start[0])
    naive = rec.step_end - rec.step_start
    assert naive.sum() > d.sum()


def test_online_pipelined_run_keeps_arrivals_and_finishes_everyone(model):
    arrivals = [0.0, 0.0, 0.03, 0.03, 0.05, 0.2, 0.2, 0.21]
    e = engine(model, num_blocks=16)
    rec = e.run_online(make_requests(arrivals=arrivals))
    rec.check()
    assert (rec.status == 0).all()
    first = rec.token_times[rec.token_offsets[:-1]]
    assert np.all(first >= np.array(arrivals))
    serial = engine(model, num_blocks=16, async_steps=False)
    serial.run_online(make_requests(arrivals=arrivals))
    assert e.outputs == serial.outputs  # greedy tokens do not depend on the timing


def test_async_steps_need_the_trace_stop():
    from executor.engine import EngineConfig

    with pytest.raises(ValueError, match="async_steps"):
        EngineConfig(num_blocks=8, stop="eos", async_steps=True)
    assert not EngineConfig(num_blocks=8, stop="eos").pipelined


def _decode_plan(step: int, reqs: list[Request]) -> StepPlan:
    return StepPlan(step, 0.0, tuple(reqs), ())


def test_runner_reads_a_decode_input_from_the_step_in_flight(model):
    """Two steps submitted before either is read give the tokens of two serial steps; a row
    with a token in flight is neither released nor preempted."""
    prompts = [[5, 9, 2, 7, 1], [3, 3, 8]]

    def run(pipelined: bool) -> tuple[list[list[int]], object, list[Request]]:
        e = engine(model)
        runner = e.runner
        reqs = [
            Request(i, 0.0, len(p), 8, 8, prompt_token_ids=tuple(p)) for i, p in enumerate(prompts)
        ]
        tables = {r.request_id: list(range(4 * r.request_id, 4 * r.request_id + 4)) for r in reqs}
        blocks_of = lambda r: tables[r.request_id]  # noqa: E731
        out = runner.execute(
            StepPlan(0, 0.0, (), tuple((r, r.num_prompt_tokens) for r in reqs)), blocks_of
        )
        for r in reqs:
            r.advance(r.num_prompt_tokens)
        tokens = [out.tokens]
        if pipelined:
            first = runner.submit(_decode_plan(1, reqs), blocks_of)
            for r in reqs:
                r.advance(1)
            preempting = StepPlan(2, 0.0, (reqs[1],), (), preempted=(reqs[0],))
            with pytest.raises(AssertionError, match="in flight"):
                runner.submit(preempting, blocks_of)
            second = runner.submit(_decode_plan(2, reqs), blocks_of)
            with pytest.raises(AssertionError, match="in flight"):
                runner.release(reqs[0])
            runner.check_integrity()  # two steps in flight: lengths lead by up to two
            tokens += [runner.wait(first).tokens, runner.wait(second).tokens]
            runner.check_integrity()
            for r in reqs:
                r.advance(1)
        else:
            for step in (1, 2):
                tokens.append(runner.execute(_decode_plan(step, reqs), blocks_of).tokens)
                for r in reqs:
                    r.advance(1)
        return tokens, runner, reqs

    serial, _, _ = run(False)
    piped, runner, reqs = run(True)
    assert piped == serial
    assert runner.generated(reqs[1]) == [t[1] for t in serial]


def test_runner_integrity_check_catches_a_broken_row_table(model):
    e = engine(model)
    e.run_offline(make_requests())
    runner = e.runner
    runner.check_integrity()
    runner._free_rows.append(runner._free_rows[0])  # a row freed twice
    with pytest.raises(AssertionError, match="free twice"):
        runner.check_integrity()
    runner._free_rows.pop()
    runner._in_flight = 3
    with pytest.raises(AssertionError, match="in flight"):
        runner.check_integrity()
