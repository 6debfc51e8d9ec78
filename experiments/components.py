"""A run config -> the objects a simulation needs (derived values computed, never stored back)."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.config import ModelConfig, RunConfig
from experiments.errors import ConfigError
from experiments.policy_factory import build_policy
from experiments.workloads import DataSources
from horizon.model_shape import ModelShape, model_shape
from horizon.policies import Policy
from horizon.request import SLO
from horizon.scheduler_config import SchedulerConfig
from simulator import CostModel, GpuSpec, gpu_spec, make_cost_model


def kv_num_blocks(model: ModelConfig, block_size: int) -> int:
    """The KV budget: ``model.num_blocks`` if set, else what the GPU's memory leaves.

    Derived as vLLM does: ``floor((memory * utilisation - weight bytes) / (block_size * KV
    bytes per token))`` (bf16; activations and CUDA graphs are not modelled).

    Raises:
        ValueError: the weights alone exceed the usable memory.
    """
    if model.num_blocks is not None:
        return model.num_blocks
    shape, gpu = model_shape(model.shape), gpu_spec(model.gpu)
    try:
        return shape.kv_blocks(gpu.memory_bytes, model.gpu_memory_utilization, block_size)
    except ValueError as e:
        raise ValueError(f"model.gpu_memory_utilization on {gpu.name}: {e}") from None


@dataclass(frozen=True)
class Components:
    """What one run is made of. ``policy`` is fresh: use it for one simulation only."""

    shape: ModelShape
    gpu: GpuSpec
    scheduler: SchedulerConfig
    policy: Policy
    cost_model: CostModel
    slo: SLO
    predictor: object | None = None  # the policy's length predictor, if it takes one


def build_components(cfg: RunConfig, sources: DataSources | None = None) -> Components:
    """Build (and so check) everything ``cfg`` names; registry names give their ValueError.

    ``sources`` provides (and trains, once per process) a policy's length predictor.
    """
    shape, gpu = model_shape(cfg.model.shape), gpu_spec(cfg.model.gpu)
    num_blocks = kv_num_blocks(cfg.model, cfg.scheduler.block_size)
    data = sources or DataSources(cfg.data)
    built = build_policy(
        cfg.policy, cfg.slo.ttft, predictor_for=lambda p: data.predictor(p, cfg.workload)
    )
    cost_model = make_cost_model(
        cfg.backend.cost_model, shape=shape, gpu=gpu, **cfg.backend.cost_model_options
    )
    _check_batch(cfg, cost_model)
    return Components(
        shape=shape,
        gpu=gpu,
        predictor=built.predictor,
        scheduler=cfg.scheduler.scheduler_config(num_blocks, cfg.backend.step_mode),
        policy=built.policy,
        cost_model=cost_model,
        slo=cfg.slo.slo,
    )


def _check_batch(cfg: RunConfig, cost_model: CostModel) -> None:
    """A cost model measured up to some decode batch (``max_num_seqs``) cannot time larger."""
    limit = getattr(cost_model, "max_num_seqs", None)
    if limit is not None and cfg.scheduler.max_num_seqs > limit:
        raise ConfigError(
            "scheduler.max_num_seqs",
            cfg.scheduler.max_num_seqs,
            f"cost model {cfg.backend.cost_model!r} was measured with at most {limit} "
            "sequences a step: lower it, or use backend=sim (the roofline)",
        )
