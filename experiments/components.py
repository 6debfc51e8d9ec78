"""A run config -> the objects a simulation needs (derived values computed, never stored back)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from experiments.config import ModelConfig, RunConfig
from horizon.model_shape import ModelShape, model_shape
from horizon.policies import Policy, make_policy
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
    free = gpu.memory_bytes * model.gpu_memory_utilization - shape.weight_bytes()
    blocks = math.floor(free / (block_size * shape.kv_bytes_per_token()))
    if blocks < 1:
        raise ValueError(
            f"model.gpu_memory_utilization={model.gpu_memory_utilization} of {gpu.name} leaves "
            f"no KV memory for {shape.name} ({shape.weight_bytes() / 1e9:.1f} GB of weights)"
        )
    return blocks


@dataclass(frozen=True)
class Components:
    """What one run is made of. ``policy`` is fresh: use it for one simulation only."""

    shape: ModelShape
    gpu: GpuSpec
    scheduler: SchedulerConfig
    policy: Policy
    cost_model: CostModel
    slo: SLO


def build_components(cfg: RunConfig) -> Components:
    """Build (and so check) everything ``cfg`` names; registry names give their ValueError."""
    shape, gpu = model_shape(cfg.model.shape), gpu_spec(cfg.model.gpu)
    num_blocks = kv_num_blocks(cfg.model, cfg.scheduler.block_size)
    return Components(
        shape=shape,
        gpu=gpu,
        scheduler=cfg.scheduler.scheduler_config(num_blocks, cfg.backend.step_mode),
        policy=make_policy(cfg.policy.name, **cfg.policy.options),
        cost_model=make_cost_model(
            cfg.backend.cost_model, shape=shape, gpu=gpu, **cfg.backend.cost_model_options
        ),
        slo=cfg.slo.slo,
    )
