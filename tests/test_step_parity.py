"""Step-level parity: replaying an engine run's measured step clock through the simulator gives
the engine's very sequence of plans and its records (tests/data/golden, see its README)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from experiments.fidelity_compare import engine_pipelined
from experiments.fidelity_manifest import Manifest
from horizon.metrics.records import RunRecords
from horizon.plan import StepPlan
from horizon.workload.requests_file import load_requests
from simulator.replay_cost_model import ReplayCostModel, ReplayMismatch
from simulator.simulation import Simulation

GOLDEN = Path(__file__).parent / "data" / "golden"
MANIFEST = GOLDEN / "manifest.json"
POLICIES = ("fcfs", "horizon")
CASES = ("golden_first_r40", "golden_burst_r800")  # light load; a burst under KV pressure

pytestmark = pytest.mark.skipif(not MANIFEST.exists(), reason="golden engine log not present")

# Per-step columns that are the plan's shape and the queues after it (all of the log's plan data).
STEP_COLUMNS = (
    "prefill_tokens",
    "decode_tokens",
    "num_prefills",
    "decode_context_tokens",
    "prefill_context_tokens",
    "prefill_attention_pairs",
    "num_running",
    "num_waiting",
    "kv_used_blocks",
    "token_budget",
)
TIME_COLUMNS = ("step_start", "step_end", "first_admit_time", "token_times")
REQUEST_COLUMNS = (
    "request_id",
    "arrival_time",
    "num_output_tokens",
    "status",
    "num_preemptions",
    "computed_tokens",
    "recomputed_tokens",
    "cached_tokens",
    "token_offsets",
)


class PlanLog:
    """A cost model wrapper that keeps each plan's contents (ids, chunks) and shape."""

    def __init__(self, inner: ReplayCostModel) -> None:
        self.inner = inner
        self.plans: list[dict] = []

    def wake_delay(self, step: int, now: float) -> float:
        return self.inner.wake_delay(step, now)

    def step_time(self, plan: StepPlan) -> float:
        self.plans.append(
            {
                "step": plan.step,
                "time": plan.time,
                "decodes": tuple(r.request_id for r in plan.decodes),
                "prefills": tuple((r.request_id, n) for r, n in plan.prefills),
                "preempted": tuple(r.request_id for r in plan.preempted),
                "prefill_tokens": plan.num_prefill_tokens,
                "decode_tokens": len(plan.decodes),
                "num_prefills": len(plan.prefills),
                "decode_context_tokens": plan.decode_context_tokens,
                "prefill_context_tokens": plan.prefill_context_tokens,
                "prefill_attention_pairs": plan.prefill_attention_pairs,
                "token_budget": plan.token_budget,
                "longest_decode_context": plan.longest_decode_context,
                "longest_of_decodes": max((r.num_computed_tokens for r in plan.decodes), default=0),
            }
        )
        return self.inner.step_time(plan)


def _manifest() -> Manifest:
    return Manifest.load(MANIFEST)


def _engine_records(policy: str, case: str = CASES[0]) -> RunRecords:
    return RunRecords.load_npz(str(GOLDEN / f"{case}.{policy}.npz"))


def _pipelined(policy: str = "fcfs", case: str = CASES[0]) -> bool:
    """Whether the engine planned each step of this log while the previous one ran (its
    meta.json's engine config)."""
    meta = json.loads((GOLDEN / f"{case}.{policy}.meta.json").read_text())
    return engine_pipelined(meta["engine"])


def _clock(eng: RunRecords, policy: str = "fcfs", case: str = CASES[0]) -> ReplayCostModel:
    return ReplayCostModel.from_records(eng, pipelined=_pipelined(policy, case))


def _case(name: str):  # noqa: ANN202
    (case,) = [c for c in _manifest().of_role("golden") if c.name == name]
    return case


def _replay(policy: str, cost_model, case_name: str = CASES[0]) -> RunRecords:  # noqa: ANN001
    m = _manifest()
    case = _case(case_name)
    sim = Simulation(
        load_requests(GOLDEN / case.requests),
        m.scheduler_config(),
        m.policies[policy].build(m.ttft_slo),
        cost_model,
        max_time=case.max_time,
        check_every=1,
        arrivals_at_step_boundaries=True,
        pipelined=_pipelined(policy, case_name),
    )
    return sim.run()


def test_golden_files_are_what_the_readme_says():
    m = _manifest()
    assert tuple(c.name for c in m.of_role("golden")) == CASES
    for name, n in zip(CASES, (50, 120)):
        case = _case(name)
        assert case.policies == POLICIES
        requests = load_requests(GOLDEN / case.requests)
        assert len(requests) == n
        for policy in POLICIES:
            eng = _engine_records(policy, name)
            eng.check()
            assert eng.num_kv_blocks == m.scheduler["num_blocks"] == 1500
            assert np.array_equal(eng.request_id, [r.request_id for r in requests])
            assert (eng.status == 0).all()  # every request finished
            assert len(eng.step_end) > 800
            # per-step preemptions (added by replay) agree with the engine's per-request counts
            assert eng.num_preempted.sum() == eng.num_preemptions.sum()
    # the burst tells the policies apart: fcfs over-admits and preempts, horizon defers
    assert _engine_records("fcfs", CASES[1]).num_preemptions.sum() > 0
    assert _engine_records("horizon", CASES[1]).num_preemptions.sum() == 0
    assert _engine_records("horizon", CASES[1]).num_refreshed.max() > 0


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_replaying_the_engines_step_clock_gives_its_plans_and_records(policy, case):
    eng = _engine_records(policy, case)
    replay = _clock(eng, policy, case)
    log = PlanLog(replay)
    sim = _replay(policy, log, case)
    replay.check_complete()
    sim.check()

    # The sequence of plans: one per logged step, at the logged start, of the logged shape.
    assert len(log.plans) == len(eng.step_end) == len(sim.step_end)
    assert [p["step"] for p in log.plans] == list(range(len(eng.step_end)))
    np.testing.assert_allclose([p["time"] for p in log.plans], eng.step_start, rtol=0, atol=1e-12)
    for name in STEP_COLUMNS:
        if name in ("num_running", "num_waiting", "kv_used_blocks"):
            continue  # recorded after the step, not in the plan log
        got = np.array([p[name] for p in log.plans])
        np.testing.assert_array_equal(got, getattr(eng, name), err_msg=f"plan {name}")
    # ... and consistent contents: the ids behind the counts.
    for p in log.plans:
        assert len(p["decodes"]) == p["decode_tokens"]
        assert sum(n for _, n in p["prefills"]) == p["prefill_tokens"]
        assert len(set(p["decodes"]) | {rid for rid, _ in p["prefills"]}) == (
            p["decode_tokens"] + p["num_prefills"]
        )
    preempted = sum(len(p["preempted"]) for p in log.plans)
    assert preempted == eng.num_preemptions.sum()
    # The longest decode: the plan's (kept incrementally in event mode) is its decodes', and
    # the one derived from the engine's token times.
    planned = [p["longest_decode_context"] for p in log.plans]
    assert max(planned) > 0 and planned == [p["longest_of_decodes"] for p in log.plans]
    np.testing.assert_array_equal(eng.longest_decode_contexts(), planned)

    # The records: per step and per request, equal to the engine's.
    _assert_same_records(sim, eng)


def _assert_same_records(sim: RunRecords, eng: RunRecords) -> None:
    for name in STEP_COLUMNS:
        np.testing.assert_array_equal(getattr(sim, name), getattr(eng, name), err_msg=name)
    np.testing.assert_allclose(sim.step_start, eng.step_start, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sim.step_end, eng.step_end, rtol=0, atol=1e-12)
    for name in REQUEST_COLUMNS:
        np.testing.assert_array_equal(getattr(sim, name), getattr(eng, name), err_msg=name)
    np.testing.assert_allclose(sim.first_admit_time, eng.first_admit_time, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sim.token_times, eng.token_times, rtol=0, atol=1e-12)
    assert sim.reject_reason == eng.reject_reason
    # Every other field too, dtypes included (new columns are compared without a change here),
    # except step columns the log predates (loaded as all -1: unknown).
    for f in fields(RunRecords):
        a, b = getattr(sim, f.name), getattr(eng, f.name)
        if f.name in TIME_COLUMNS or not isinstance(a, np.ndarray):
            assert f.name in TIME_COLUMNS or a == b, f.name
            continue
        if len(b) == len(eng.step_end) and np.all(b == -1) and not np.all(a == -1):
            continue  # not in the log
        assert a.dtype == b.dtype, f.name
        np.testing.assert_array_equal(a, b, err_msg=f.name)


def test_a_serial_run_has_arrivals_during_steps():
    """What ``arrivals_at_step_boundaries`` is for: without it a step's ``num_waiting`` counts
    the requests that arrived while it ran, which the engine's (queued between steps) does not.
    (A serial loop's: the pipelined loop, which the golden logs are, reads its queue after each
    step is submitted, so there the two coincide.)"""
    e, rec, arrivals = _live_engine_run(async_steps=False)
    from test_engine_offline import make_requests

    from horizon.policies import make_policy

    sim = Simulation(
        make_requests(arrivals=arrivals),
        e.config.scheduler_config(e.num_blocks),
        make_policy("fcfs"),
        ReplayCostModel.from_records(rec),
    ).run()
    np.testing.assert_array_equal(sim.prefill_tokens, rec.prefill_tokens)
    np.testing.assert_array_equal(sim.decode_tokens, rec.decode_tokens)
    assert (sim.num_waiting > rec.num_waiting).sum() >= 1
    assert (sim.num_waiting >= rec.num_waiting).all()


def test_the_other_policys_plans_do_not_replay():
    """Under the burst the policies' decisions differ: horizon's clock replayed with fcfs's
    decisions (or the reverse) is detected, so the parity above is the policy's, not luck."""
    for policy, other in (("fcfs", "horizon"), ("horizon", "fcfs")):
        eng = _engine_records(other, CASES[1])
        try:
            sim = _replay(policy, _clock(eng, other, CASES[1]), CASES[1])
        except ReplayMismatch:
            continue
        with pytest.raises(AssertionError):
            _assert_same_records(sim, eng)


def _replay_instant(policy: str, eng: RunRecords) -> RunRecords:
    m = _manifest()
    case = _case(CASES[0])
    return Simulation(
        load_requests(GOLDEN / case.requests),
        m.scheduler_config(),
        m.policies[policy].build(m.ttft_slo),
        _clock(eng, policy),
        max_time=case.max_time,
        pipelined=_pipelined(policy),
    ).run()


def test_a_perturbed_step_duration_is_detected():
    eng = _engine_records("fcfs")
    start, end = eng.step_start.copy(), eng.step_end.copy()
    k = len(end) // 2
    if _pipelined():
        # step k ends after step k + 2's logged start: k + 2, planned once k's tokens are
        # read, would be planned late
        assert start[k + 2] + 1e-4 < end[k + 1]
        end[k] = start[k + 2] + 1e-4
        late = k + 2
    else:
        end[k] -= 1e-4  # step k ends earlier: step k + 1 would be planned before its start
        late = k + 1
    with pytest.raises(ReplayMismatch, match=f"step {late}"):
        _replay("fcfs", ReplayCostModel(start, end, pipelined=_pipelined()))


def test_a_longer_step_that_shifts_the_clock_is_detected():
    """A step 0.5 ms longer, the rest of the clock shifted consistently: the replay runs (the
    clock is self-consistent), but arrivals now fall into other steps, so the plans and records
    are no longer the engine's, and the comparison says so."""
    eng = _engine_records("fcfs")
    k = 30
    start, end = eng.step_start.copy(), eng.step_end.copy()
    end[k:] += 5e-4
    start[k + 1 :] += 5e-4
    sim = _replay("fcfs", ReplayCostModel(start, end, pipelined=_pipelined()))
    differ = [n for n in STEP_COLUMNS if not np.array_equal(getattr(sim, n), getattr(eng, n))]
    assert "prefill_tokens" in differ and "decode_tokens" in differ
    with pytest.raises(AssertionError):
        _assert_same_records(sim, eng)


def test_a_dropped_step_is_detected():
    """One step less in the clock: the replay leaves the log (a plan at another time, or a
    step count that differs) or, where the loop waits for each logged start, the records
    differ; either way the parity check fails."""
    eng = _engine_records("fcfs")
    k = len(eng.step_end) // 3
    replay = ReplayCostModel(
        np.delete(eng.step_start, k), np.delete(eng.step_end, k), pipelined=_pipelined()
    )
    with pytest.raises((ReplayMismatch, AssertionError)):
        sim = _replay("fcfs", replay)
        replay.check_complete()
        _assert_same_records(sim, eng)


LIVE_ARRIVALS = [0.0, 0.0, 0.06, 0.06 + 1e-6, 0.06 + 2e-4, 0.14, 0.14, 0.145]


def _live_arrivals(e) -> list[float]:  # noqa: ANN001
    """``LIVE_ARRIVALS`` with its gaps between groups stretched to this machine's speed: the
    first group must be served before the second arrives (the run idles) on a slow or busy CPU
    too (3x the slower of two timed runs). The offsets within a group (1 us, 200 us) stay as
    they are."""
    import time

    from test_engine_offline import make_requests

    e.run_offline(make_requests()[:2], "fcfs")  # warm: compiled, caches filled
    took = []
    for _ in range(2):  # the slower of two: a machine busy with other work varies
        t0 = time.perf_counter()
        e.run_offline(make_requests()[:2], "fcfs")
        took.append(time.perf_counter() - t0)
    scale = max(1.0, 3.0 * max(took) / 0.06)
    return [0.0 if t == 0 else round(t, 2) * scale + (t - round(t, 2)) for t in LIVE_ARRIVALS]


def _live_engine_run(async_steps: bool):  # noqa: ANN202
    """(engine, records, arrivals) of a real online fcfs run of a tiny model on the CPU (wall
    clock), in a KV pool small enough to preempt."""
    import torch
    from test_engine_offline import engine, make_model, make_requests

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is fastest
    try:
        e = engine(make_model(), num_blocks=14, async_steps=async_steps)
        arrivals = _live_arrivals(e)
        return e, e.run_online(make_requests(arrivals=arrivals), "fcfs"), arrivals
    finally:
        torch.set_num_threads(threads)


def _replay_live(e, replay: ReplayCostModel, pipelined: bool, arrivals) -> RunRecords:  # noqa: ANN001
    from test_engine_offline import make_requests

    from horizon.policies import make_policy

    return Simulation(
        make_requests(arrivals=arrivals),
        e.config.scheduler_config(e.num_blocks),
        make_policy("fcfs"),
        replay,
        check_every=1,
        arrivals_at_step_boundaries=True,
        pipelined=pipelined,
    ).run()


def test_a_live_cpu_engine_run_with_idle_gaps_replays_exactly():
    """A real online engine run that sleeps between arrivals, wakes a little late (an arrival
    1 us after the one that woke it is queued before the plan) and preempts in its small KV
    pool: replayed, it gives the engine's records. (The golden log never idles after its first
    step.) The serial loop: each step's tokens read before the next is planned."""
    e, rec, arrivals = _live_engine_run(async_steps=False)
    assert (rec.step_start[1:] > rec.step_end[:-1]).sum() >= 2  # it idled and woke up
    replay = ReplayCostModel.from_records(rec)
    sim = _replay_live(e, replay, pipelined=False, arrivals=arrivals)
    replay.check_complete()
    _assert_same_records(sim, rec)


def test_a_live_pipelined_cpu_engine_run_replays_exactly():
    """The same run on the pipelined engine (each step planned before the previous one's tokens
    are read): replayed through ``Simulation(pipelined=True)``, it gives the engine's records,
    so the simulator's plan-ahead loop is the engine's."""
    e, rec, arrivals = _live_engine_run(async_steps=True)
    assert (rec.step_start[1:] < rec.step_end[:-1]).sum() >= 10  # planned ahead
    assert rec.num_preemptions.sum() > 0
    replay = ReplayCostModel.from_records(rec, pipelined=True)
    sim = _replay_live(e, replay, pipelined=True, arrivals=arrivals)
    replay.check_complete()
    _assert_same_records(sim, rec)
    with pytest.raises(ValueError, match="pipelined"):
        ReplayCostModel.from_records(rec)  # overlapping steps need the flag
    with pytest.raises(ReplayMismatch):  # a serial loop plans too late for this log
        late = ReplayCostModel.from_records(rec, pipelined=True)
        _replay_live(e, late, pipelined=False, arrivals=arrivals)


def test_bad_step_clocks_are_refused():
    with pytest.raises(ValueError, match="1-D"):
        ReplayCostModel(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="start"):
        ReplayCostModel(np.array([0.0, 0.5]), np.array([1.0, 2.0]))  # overlapping steps
    with pytest.raises(ValueError, match="finite"):
        ReplayCostModel(np.array([0.0]), np.array([np.nan]))
