"""Inline KV copies (``Placement(copy="inline")``): a decode replica's boundary takes its
imports, copies them one after another behind its step in flight at the link's own speed, its
host waits for them, and the plan it makes then holds them (random clusters with inline
copies: ``tests/test_reported_placement.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from sched_driver import ConstantCost
from test_disaggregation import SHAPE, _run

from horizon.cluster import make_router
from horizon.cluster.disagg_metrics import ttft_parts
from horizon.policies import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.device_sharing import DeviceSpec
from simulator.kv_link import LinkSpec
from simulator.reported_placement import Placement

INLINE = Placement("reported", copy="inline")
STEP = 0.01
LINK = LinkSpec("test", 1e9, 1e-3)


def test_the_same_seed_gives_byte_identical_records():
    digests = {_run(7, 2, 2, 0, True, True, INLINE)[2].digest() for _ in range(2)}
    assert len(digests) == 1
    assert _run(7, 2, 2, 0, True, True, "reported")[2].digest() not in digests


def _pair(placement: Placement | str, decode_device=None, prefill_device=None):  # noqa: ANN001, ANN202
    """A prefill and a decode replica (steps of 10 ms): request 0 alone, then request 1 handed
    off while request 0 decodes; each replica on a GPU of its own or the device given."""
    cfg = SchedulerConfig(num_blocks=64, block_size=16, max_num_seqs=4,
                          max_num_batched_tokens=256, max_model_len=1024)  # fmt: skip
    devices = {"prefill": prefill_device, "decode": decode_device}
    setups = [ReplicaSetup(cfg, make_policy("fcfs"), ConstantCost(STEP), SHAPE, role=role,
                           device=devices[role]) for role in ("prefill", "decode")]  # fmt: skip
    reqs = [Request(0, 0.0, 40, 30, 30), Request(1, 0.083, 40, 5, 5)]
    sim = ClusterSimulation(reqs, setups, make_router("round_robin"), check_every=1,
                            decode_router=make_router("least_kv"), kv_link=LINK, pipelined=True,
                            arrivals_at_step_boundaries=True, placement=placement)  # fmt: skip
    return sim.run()


def test_a_copy_waits_for_the_step_in_flight_and_the_next_plan_holds_it():
    rec = _pair(INLINE)
    t, parts = rec.transfers, ttft_parts(rec)
    copy = LINK.time(3 * 16 * SHAPE.kv_bytes_per_token())  # 40 tokens moved: 3 blocks
    assert list(t["num_blocks"]) == [3, 3]
    took = t["end"] - t["start"]
    assert took[0] == pytest.approx(copy)  # the decode replica was idle
    assert took[1] == pytest.approx(STEP + copy)  # behind the step in flight
    dec = rec.replicas[1]
    for end in t["end"]:  # the plan made when the copy is in holds the request
        assert np.min(np.abs(dec.step_start - end)) < 1e-12
    assert parts["first_decode"] == pytest.approx([STEP, STEP])
    gaps = np.diff(dec.step_end)
    assert gaps.max() == pytest.approx(STEP + copy)  # the host's wait delays one step only
    link = ttft_parts(_pair("reported"))
    assert link["first_decode"][1] > 1.5 * STEP  # over the link: taken a boundary later


def test_inline_copies_need_reported_placement():
    with pytest.raises(ValueError, match="Placement.copy"):
        Placement("reported", copy="fabric")
    with pytest.raises(ValueError, match="Placement.copy='inline' needs kind 'reported'"):
        Placement("live", copy="inline")


def test_alone_on_a_quantum_device_copies_take_the_times_they_take_on_a_gpu_of_their_own():
    """A decode replica alone on a device of simulated turns: its copies are its device work,
    queued behind its step in flight, and nothing shares the turns, so every time is the
    device-of-its-own one; with the prefill replica on the same device, the copies are
    stretched by its turns, never shortened."""
    gpu = DeviceSpec("gpu0", "quantum", quantum_s=1e-3)
    own, alone = _pair(INLINE), _pair(INLINE, decode_device=gpu)
    for k in ("start", "end", "num_blocks"):
        assert np.allclose(own.transfers[k], alone.transfers[k], rtol=0, atol=1e-12), k
    for k in ("step_start", "step_end", "token_times"):  # the plan after the copies holds them
        assert np.allclose(getattr(own.replicas[1], k), getattr(alone.replicas[1], k)), k
    assert ttft_parts(alone)["first_decode"] == pytest.approx([STEP, STEP])
    both = _pair(INLINE, decode_device=gpu, prefill_device=gpu)
    took, own_took = (r.transfers["end"] - r.transfers["start"] for r in (both, own))
    assert np.all(took >= own_took - 1e-12) and took.max() > own_took.max() + 1e-3
