"""One simulator run: fresh requests through the simulator, then metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass

from experiments.components import Components
from experiments.config import RunConfig
from horizon.metrics import RunRecords, summarize
from horizon.workload import Workload
from simulator import Simulation


@dataclass(frozen=True)
class RunResult:
    """What a run measured (kept apart from its config)."""

    records: RunRecords
    metrics: dict
    stalled: int  # requests left waiting when nothing could ever run them
    wall_s: float  # wall-clock seconds of simulation + metrics


def simulate(cfg: RunConfig, workload: Workload, parts: Components) -> RunResult:
    """Run ``workload`` (fresh copies of its requests) under ``parts``; ``parts`` is used up."""
    start = time.perf_counter()
    requests = workload.new_requests()
    prepare = getattr(parts.predictor, "prepare", None)
    if prepare is not None:
        prepare(requests)  # one batched model call per run (the predictor's per-run memo)
    sim = Simulation(
        requests,
        parts.scheduler,
        parts.policy,
        parts.cost_model,
        max_time=cfg.backend.max_time,
        check_every=cfg.backend.check_every,
        arrivals_at_step_boundaries=cfg.backend.arrivals_at_step_boundaries,
        pipelined=cfg.backend.pipelined,
    )
    records = sim.run()
    metrics = summarize(records, slo=parts.slo)
    return RunResult(records, metrics, sim.stalled, time.perf_counter() - start)
