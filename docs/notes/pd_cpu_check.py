"""The engine's P/D placement against the simulator's two placements, on the CPU.

    PYTHONPATH=. python docs/notes/pd_cpu_check.py [DECODE_BLOCKS N GAP_S]

Tiny-model engine workers (a prefill and a decode replica, ``executor.cluster_engine``) serve
N requests arriving every GAP_S seconds with a decode pool of DECODE_BLOCKS blocks of 4
tokens, so the decode pool is the bottleneck; then the simulator serves the same requests with
each replica's step cost fitted to that run's own steps (linear in prefill and decode tokens),
with ``placement="live"`` and ``"reported"`` (also with ``drain_s`` the decode replica's mean
step: on the CPU a step runs inside its submission, so a preempting plan's report precedes a
whole step of host time). Prints one row per side: mean and p90 KV wait,
refusals, the decode replica's steps ended between a placement and its taking
(``experiments.pd_fidelity.placement_lag``), its preemptions and most waiting, the prefill
replica's steps.
"""

import sys

import numpy as np

from executor.cluster_engine import EngineCluster
from executor.cluster_worker import WorkerSpec
from executor.engine import EngineConfig
from executor.model.testing import tiny_config
from experiments.pd_fidelity import placement_lag, replica_load
from horizon.cluster import make_router
from horizon.plan import plan_shape
from horizon.policies.registry import make_policy
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from simulator.cluster_simulation import ClusterSimulation, ReplicaSetup
from simulator.kv_link import LinkSpec
from simulator.reported_placement import Placement

ENGINE = {"block_size": 4, "max_num_batched_tokens": 64, "max_num_seqs": 32, "max_model_len": 256}
PREFILL_BLOCKS = 400


def workload(n: int, gap: float, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, o = int(rng.integers(8, 40)), int(rng.integers(20, 80))
        ids = tuple(rng.integers(0, 512, p).tolist())
        out.append(Request(i, gap * i, p, 128, o, prompt_token_ids=ids))
    return out


class Linear:
    def __init__(self, coef: np.ndarray) -> None:
        self.coef = coef

    def step_time(self, plan) -> float:  # noqa: ANN001
        p, d, *_ = plan_shape(plan)
        return float(self.coef[0] + self.coef[1] * p + self.coef[2] * d)


def fit(r) -> Linear:  # noqa: ANN001 - one replica's RunRecords
    dur = r.step_end - r.step_start
    x = np.stack([np.ones_like(dur), r.prefill_tokens, r.decode_tokens], 1)
    return Linear(np.maximum(np.linalg.lstsq(x, dur, rcond=None)[0], 0))


def row(side: str, rec, refusals: int) -> str:  # noqa: ANN001
    t = rec.transfers
    wait = 1e3 * (t["start"] - t["ready"])
    p, d = (replica_load(r) for r in rec.replicas)
    between = placement_lag(rec)["steps_between"]
    return (f"| {side} | {wait.mean():.0f} | {np.percentile(wait, 90):.0f} | {refusals} | "
            f"{between:.2f} | {d['preemptions']} | {d['waiting_max']} | {p['steps']} |")


def main() -> None:
    nb, n, gap = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])) if len(sys.argv) > 3 \
        else (200, 300, 0.004)  # fmt: skip
    import executor.cluster_handoffs as ch

    specs = [WorkerSpec(tiny_config(), EngineConfig(num_blocks=b, **ENGINE), "cpu", f"{r}{i}", r,
                        weight_std=0.2)
             for i, (r, b) in enumerate((("prefill", PREFILL_BLOCKS), ("decode", nb)))]  # fmt: skip
    refused = [0]
    on_refused = ch.EngineHandoffs.on_refused

    def counted(self, i, rid) -> None:  # noqa: ANN001
        refused[0] += 1
        on_refused(self, i, rid)

    ch.EngineHandoffs.on_refused = counted
    route = dict(router=make_router("round_robin"), policy="fcfs")
    with EngineCluster(specs, poll_s=0.02) as c:
        c.run(workload(10, gap, 1), (), decode_router=make_router("least_kv"), **route)  # warm-up
        eng = c.run(workload(n, gap), (), decode_router=make_router("least_kv"), **route)
    eng.check()
    lines = ["| side | KV wait mean ms | p90 ms | refusals | steps before taken | decode "
             "preemptions | decode most waiting | prefill steps |", "|---|---|---|---|---|---|---|"
             "---|", row("engine", eng, refused[0])]  # fmt: skip
    dec = eng.replicas[1]
    step_s = float(np.mean(dec.step_end - dec.step_start))  # a CPU step runs inside its submit
    for label, placement in (("live", "live"), ("reported", "reported"),
                             (f"reported, drain_s {1e3 * step_s:.1f} ms",
                              Placement("reported", drain_s=step_s))):  # fmt: skip
        setups = [ReplicaSetup(SchedulerConfig(num_blocks=b, **ENGINE), make_policy("fcfs"),
                               fit(r), shape=tiny_config().shape, role=role)
                  for r, (role, b) in zip(eng.replicas, (("prefill", PREFILL_BLOCKS),
                                                         ("decode", nb)))]  # fmt: skip
        sim = ClusterSimulation(workload(n, gap), setups, make_router("round_robin"),
                                pipelined=True, arrivals_at_step_boundaries=True,
                                decode_router=make_router("least_kv"), placement=placement,
                                kv_link=LinkSpec("cpu", 1e9, 5e-4))  # fmt: skip
        rec = sim.run()
        rep = sim.transfers.reported
        lines.append(row(f"sim {label}", rec, rep.refusals if rep else 0))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
