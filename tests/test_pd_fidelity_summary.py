"""The P/D fidelity summary (``experiments.pd_fidelity.summary``): a simulator variant appears
only where every seed's row has it, with the engine's figures beside it."""

from __future__ import annotations

from experiments.pd_fidelity import LOADS, SEEDS, SIDES, render, summary


def _figures(goodput: float, pd: bool) -> dict:
    out = {"goodput": goodput, "ttft_mean": 0.01, "itl_mean": 0.002, "e2e_mean": 0.4}
    if pd:
        out["ttft_parts"] = {"transfer": 0.0015, "kv_wait": 0.0, "first_decode": 0.003}
    return out


def test_a_variant_is_summarized_where_every_row_has_it():
    rows = []
    for side in SIDES:
        for load in LOADS:
            for seed in SEEDS:
                pd = side == "pd"
                row = {"side": side, "load": load, "seed": seed, "engine": _figures(0.9, pd)}
                row["isolated"] = _figures(1.0, pd)
                row["shared"] = _figures(0.95, pd)
                if side == "pd":  # the new variant on one side only
                    row["colocated"] = _figures(0.9 if seed else 0.8, pd)
                rows.append(row)
    out = summary({"rows": rows})
    got = {(r["side"], r["load"], r["sim"]) for r in out}
    assert ("pd", LOADS[0], "colocated") in got and ("mixed", LOADS[0], "colocated") not in got
    col = next(r for r in out if r["sim"] == "colocated")
    assert abs(col["goodput"]["max_err_pts"] - 10.0) < 1e-9  # seed 0: 0.8 against 0.9
    assert "| pd | " in render(out)


def test_replica_load_counts_a_full_pool_s_preemptions():
    import random

    from sched_driver import ConstantCost, random_requests

    from experiments.pd_fidelity import replica_load
    from horizon.cluster import make_router
    from horizon.policies import make_policy
    from horizon.scheduler_config import SchedulerConfig
    from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup

    cfg = SchedulerConfig(
        num_blocks=24, block_size=16, max_num_seqs=16, max_num_batched_tokens=256,
        max_model_len=1024,
    )  # fmt: skip
    reqs = random_requests(random.Random(3), 40, max_prompt=60, max_output=120, rate=200.0)
    setups = [ReplicaSetup(cfg, make_policy("fcfs"), ConstantCost(0.01))]
    rec = ClusterSimulation(reqs, setups, make_router("round_robin"), pipelined=True).run()
    (r,) = rec.replicas
    load = replica_load(r)
    assert load["preemptions"] == int(r.num_preempted.sum()) > 0
    assert 0 < load["requests_preempted"] <= load["preemptions"]
    assert 0 < load["running_mean"] <= 16 and 0 < load["kv_used_mean"] <= 24
    assert load["steps"] == len(r.step_start) and load["waiting_max"] > 0


def test_a_row_s_rebuilt_requests_are_checked_by_their_digest(monkeypatch):
    import random

    import pytest
    from sched_driver import random_requests

    from experiments import pd_fidelity
    from horizon.request import Request

    reqs = random_requests(random.Random(5), 30, max_prompt=60, max_output=40, rate=50.0)
    row = {"side": "pd", "load": 100.0, "seed": 0, "requests_digest": ""}
    row["requests_digest"] = pd_fidelity.requests_digest(reqs)
    monkeypatch.setattr(pd_fidelity, "case_requests", lambda load, seed, tok: list(reqs))
    assert pd_fidelity.row_requests(row, None) == reqs
    for field, value in (
        ("arrival_time", 1e-9),
        ("num_prompt_tokens", 1),
        ("true_output_tokens", -1),
    ):
        r = reqs[7]
        kw = {
            "arrival_time": r.arrival_time,
            "num_prompt_tokens": r.num_prompt_tokens,
            "max_output_tokens": r.max_output_tokens,
            "true_output_tokens": r.true_output_tokens,
        }
        kw[field] += value
        changed = [*reqs[:7], Request(r.request_id, **kw), *reqs[8:]]
        monkeypatch.setattr(pd_fidelity, "case_requests", lambda load, seed, tok, c=changed: c)
        with pytest.raises(ValueError, match="requests differ"):
            pd_fidelity.row_requests(row, None)


def test_the_quantum_variant_runs_either_side_on_the_device_s_turns(monkeypatch):
    import pytest

    from experiments import pd_fidelity

    seen = []

    def fake(side, requests, link, device, cost_model=None, placement="live"):  # noqa: ANN001
        seen.append((side, device, placement))
        return "records"

    monkeypatch.setattr(pd_fidelity, "simulate", fake)
    monkeypatch.setattr(pd_fidelity, "figures", lambda rec: {"of": rec})
    for side in SIDES:
        assert pd_fidelity._placed("quantum", [], None, side) == {"of": "records"}
    assert [s for s, _, _ in seen] == list(SIDES)
    for _, device, placement in seen:
        assert device.sharing == "quantum" and device.quantum_s == pd_fidelity.QUANTUM_S
        assert placement.kind == "reported" and placement.copy == "link"
    pd_fidelity._placed("reported", [], None)
    assert seen[-1][0] == "pd" and seen[-1][1] == "gpu0"  # serialized steps, as before
    with pytest.raises(ValueError, match="variant must be one of"):
        pd_fidelity.add_reported(None, "timeslice")
