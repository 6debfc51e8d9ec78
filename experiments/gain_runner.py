"""Runs behind the headline (``experiments.policy_gain``): one row's metrics at one load, the
bisection for the highest load that holds a goodput target, and the worker that does both for
one (row, seed) in a process of its own.

A row is a name and its hydra overrides (``policy=...`` and any option); a setting is the list
of overrides every row shares (the workload, the pool, the SLO). ``Runner`` composes configs with
hydra (it needs ``initialize_config_dir``); ``SeedTask`` is given composed configs and runs
anywhere, e.g. in a ``ProcessPoolExecutor`` worker.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from hydra import compose
from omegaconf import OmegaConf
from tqdm import tqdm

from experiments.components import build_components
from experiments.config import RunConfig
from experiments.gain_settings import SETTINGS
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload

METRICS = (
    "goodput_lifetime",
    "throughput_tok_s",
    "ttft_p99",
    "itl_p99",
    "recompute_waste",
    "queue_wait_max",
    "preemptions",
)


@dataclass(frozen=True)
class Plan:
    num_requests: int
    seeds: tuple[int, ...]
    iterations: int  # bisection steps
    lo: float
    hi: float
    # with a tolerance only: up to this many more steps while the goodput at the rate found is
    # more than the tolerance above the target (near saturation goodput falls off a cliff)
    refine: int = 0


def bisect_rate(
    goodput_at: Callable[[float], float],
    target: float,
    plan: Plan,
    tolerance: float | None = None,
) -> float:
    """Highest rate in [lo, hi] (to the plan's precision) whose goodput is >= ``target``.

    With ``tolerance``: after the plan's steps, up to ``plan.refine`` more while the goodput at
    the rate found exceeds ``target + tolerance`` (rates are kept to 0.01 req/s).
    """
    lo, hi = plan.lo, plan.hi
    if goodput_at(lo) < target:
        return lo
    if goodput_at(hi) >= target:
        return hi
    steps = plan.iterations + (plan.refine if tolerance is not None else 0)
    for i in range(steps):
        if i >= plan.iterations and goodput_at(lo) <= target + tolerance:
            break
        mid = round((lo + hi) / 2, 2)
        if mid in (lo, hi):
            break
        if goodput_at(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def compose_run(overrides: list[str]) -> RunConfig:
    """The run config of hydra ``overrides`` (inside ``initialize_config_dir``)."""
    cfg = OmegaConf.to_object(compose("run", overrides=overrides))
    assert isinstance(cfg, RunConfig)
    return cfg


class Runner:
    """Runs (policy, rate) over the plan's seeds, reusing loaded data and workloads."""

    def __init__(
        self,
        plan: Plan,
        extra: list[str],
        policies: dict[str, list[str]],
        setting: Sequence[str] = SETTINGS["poisson"],
    ) -> None:
        self.plan, self.extra, self.policies, self.setting = plan, extra, policies, list(setting)
        self.sources: DataSources | None = None
        self._workloads: dict[tuple[float, int], object] = {}
        self.runs = 0
        # bisections: the number of runs is not known ahead, so a counter with its rate
        self.progress = tqdm(desc="simulated runs", unit="run", disable=None, file=sys.stderr)

    def config(self, policy: str, rate: float, seed: int) -> RunConfig:
        return compose_run(
            [
                *self.setting,
                *self.extra,
                *self.policies[policy],
                f"rate={rate}",
                f"seed={seed}",
                f"num_requests={self.plan.num_requests}",
            ]
        )

    def metrics(self, policy: str, rate: float) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {m: [] for m in METRICS}
        for seed in self.plan.seeds:
            cfg = self.config(policy, rate, seed)
            if self.sources is None:
                self.sources = DataSources(cfg.data)
            key = (rate, seed)
            if key not in self._workloads:
                self._workloads[key] = make_workload(cfg, self.sources)
            result = simulate(cfg, self._workloads[key], build_components(cfg, self.sources))
            self.runs += 1
            self.progress.update()
            for m in METRICS:
                out[m].append(float(result.metrics[m]))
        return out


@dataclass(frozen=True)
class SeedTask:
    """One row on one seed: ``cfg`` is its composed config (any rate; the task sets it)."""

    row: str
    cfg: RunConfig
    seed: int
    plan: Plan
    loads: tuple[float, ...] = ()  # loads to measure; empty: bisect rate_at_90 instead
    target: float = 0.9


@dataclass(frozen=True)
class SeedResult:
    row: str
    seed: int
    rate_at_90: float | None  # None when the task measured loads
    at: dict[float, dict[str, float]]  # every rate run -> its metrics
    runs: int


def run_task(task: SeedTask, sources: DataSources | None = None) -> SeedResult:
    """Do ``task``: the bisection on its seed, or its loads. Each rate runs once."""
    sources = sources or DataSources(task.cfg.data)
    at: dict[float, dict[str, float]] = {}

    def metrics(rate: float) -> dict[str, float]:
        if rate not in at:
            cfg = replace(task.cfg, rate=rate, seed=task.seed, num_requests=task.plan.num_requests)
            result = simulate(cfg, make_workload(cfg, sources), build_components(cfg, sources))
            at[rate] = {m: float(result.metrics[m]) for m in METRICS}
        return at[rate]

    rate90 = None
    if task.loads:
        for load in task.loads:
            metrics(load)
    else:
        rate90 = bisect_rate(lambda r: metrics(r)["goodput_lifetime"], task.target, task.plan)
    return SeedResult(task.row, task.seed, rate90, at, len(at))


_PROCESS: dict[str, DataSources] = {}  # a pool worker's loaded data, kept for its next tasks


def _run_in_worker(task: SeedTask) -> SeedResult:
    if "sources" not in _PROCESS:
        _PROCESS["sources"] = DataSources(task.cfg.data)
    return run_task(task, _PROCESS["sources"])


def run_tasks(tasks: Sequence[SeedTask], jobs: int) -> list[SeedResult]:
    """Results of ``tasks``, in their order: run in this process (``jobs == 1``) or in ``jobs``
    forked workers, each loading the data once. Tasks with a learned predictor (the slowest)
    are handed out first, so the workers finish together."""
    order = sorted(range(len(tasks)), key=lambda i: not _learned(tasks[i]))
    if jobs == 1:
        sources = DataSources(tasks[0].cfg.data) if tasks else None
        done = [run_task(tasks[i], sources) for i in order]
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            done = list(pool.map(_run_in_worker, [tasks[i] for i in order]))
    out: list[SeedResult] = [None] * len(tasks)  # type: ignore[list-item]
    for i, result in zip(order, done, strict=True):
        out[i] = result
    return out


def _learned(task: SeedTask) -> bool:
    return (task.cfg.policy.predictor or {}).get("name") == "learned"
