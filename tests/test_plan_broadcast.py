"""Rank 0's plans, broadcast (``executor.plan_broadcast``), rebuilt and run by a follower's own
runner in the same process (one model, no split: what is checked is the wire, not the
all-reduce; ``test_tensor_parallel`` runs it across gloo ranks): the follower generates the
same tokens in the same number of steps, with preemptions, pipelined steps, sampling,
speculation's verifications and end-of-sequence stops, and its runner's mirrored block tables
match rank 0's after every step."""

from __future__ import annotations

import pytest
from test_engine_offline import engine, make_model, make_requests

from executor.plan_broadcast import PlanBroadcast, _table_delta, follow, follower_sampling
from executor.sampling import SamplingParams
from horizon.speculation import SpeculationConfig


@pytest.fixture(scope="module")
def model():
    return make_model()


def leader_and_follower(model, run=lambda e: e.run_offline(make_requests()), **kw):  # noqa: ANN001
    """Rank 0's run with its messages kept; a follower fed them; both runs' tokens and steps."""
    lead = engine(model, **kw)
    messages: list[tuple] = []
    lead.runner = PlanBroadcast(lead.runner, lead.prompt_of, lead.sampling_of,
                                send=messages.append)  # fmt: skip
    records = run(lead)
    lead.runner.close()
    kw.pop("sampling", None)
    follower = engine(model, sampling=follower_sampling, **kw)
    it = iter(messages)
    check = not follower.config.pipelined
    outputs, steps, preempted = follow(follower.runner, recv=lambda: next(it), check=check)
    assert next(it, None) is None and follower.runner.num_sequences == 0
    lead_out = {k: list(v) for k, v in lead.outputs.items()}
    return lead_out, outputs, records, steps, preempted


@pytest.mark.parametrize("pipelined", [False, True])
def test_the_follower_makes_rank_0s_tokens_with_preemptions(model, pipelined):
    lead, follow_out, records, steps, preempted = leader_and_follower(
        model, num_blocks=16, async_steps=pipelined
    )
    assert int(records.num_preemptions.sum()) == preempted > 0  # a 16-block pool preempts
    assert follow_out == lead and len(lead) == len(make_requests())
    assert steps == len(records.step_end)


def test_sampling_parameters_travel(model):
    params = SamplingParams(temperature=0.9, top_k=20)
    lead, follow_out, *_ = leader_and_follower(model, sampling=lambda r: params)
    greedy, *_ = leader_and_follower(model)
    assert follow_out == lead and lead != greedy  # sampled, and sampled alike


def test_speculations_verifications_and_eos_stops_travel(model):
    spec = SpeculationConfig(policy="fixed", num_draft_tokens=3)
    lead, follow_out, records, steps, _ = leader_and_follower(
        model, speculation=spec, async_steps=False, stop="eos", num_blocks=24
    )
    assert follow_out == lead and steps == len(records.step_end)


def test_an_online_run_with_arrivals(model):
    arrivals = [0.0, 0.001, 0.002, 0.01, 0.011, 0.02, 0.03, 0.031]
    lead, follow_out, *_ = leader_and_follower(
        model, run=lambda e: e.run_online(make_requests(arrivals=arrivals)), num_blocks=16
    )
    assert follow_out == lead


def test_table_deltas():
    assert _table_delta([], [4, 5]) == (0, (4, 5))
    assert _table_delta([4, 5], [4, 5, 9]) == (2, (9,))
    assert _table_delta([4, 5], [4, 5]) == (2, ())
    assert _table_delta([4, 5, 9], [4, 5]) == (2, ())  # drafts' block trimmed
    assert _table_delta([4, 5], [7, 8, 9]) == (0, (7, 8, 9))  # anything else: whole
