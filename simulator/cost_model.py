"""Step cost models: a plan's shape -> seconds.

The interface is one call, ``step_time(plan)``, reading only the plan's aggregate shape (prefill
tokens, decode count, context tokens read, attention pairs), so it is O(1) per step. The
analytic model is a roofline: a step moves the weights once plus the KV it reads and writes,
and does 2 FLOPs per parameter per token plus attention; its time is the larger of the two over
the GPU's measured bandwidth and peak, plus a fixed per-step overhead (launches, CPU work). It
needs no measurement, so it serves any shape; the configs' default is the model fitted to the
engine's own steps (``simulator.engine_cost_model``, same interface) where they were measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from horizon.model_shape import ModelShape
from horizon.plan import StepPlan, plan_shape
from simulator.gpu import GpuSpec


class CostModel(Protocol):
    """Maps a plan to its duration in seconds. Pure (same plan shape, same time), or stateful
    with a ``fresh()`` that returns a copy at its start state (``fresh_cost_model``): every
    simulated replica's backend takes its own, so that no state passes between replicas or
    runs. A stateful model may also define ``check_integrity()``; the backend calls it."""

    def step_time(self, plan: StepPlan) -> float: ...


def fresh_cost_model(model: CostModel) -> CostModel:
    """``model.fresh()`` for a model that defines it (state of its own: a new start state per
    replica and run), else ``model`` itself (pure; a block-resampled noise stream is shared)."""
    fresh = getattr(model, "fresh", None)
    return model if fresh is None else fresh()


@dataclass(frozen=True)
class RooflineCostModel:
    """``max(bytes / bandwidth, flops / peak) + overhead_s`` per step (bf16 weights and KV)."""

    shape: ModelShape
    gpu: GpuSpec
    overhead_s: float = 0.0005
    dtype_bytes: int = 2
    _k: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.overhead_s >= 0:
            raise ValueError(f"RooflineCostModel.overhead_s must be >= 0, got {self.overhead_s!r}")
        s, bw, peak = self.shape, self.gpu.mem_bandwidth, self.gpu.peak_flops
        head = s.vocab_size * s.hidden_size
        object.__setattr__(
            self,
            "_k",
            (
                s.weight_bytes(self.dtype_bytes) / bw,  # seconds to read the weights
                s.kv_bytes_per_token(self.dtype_bytes) / bw,  # seconds per KV token moved
                2 * (s.matmul_params - head) / peak,  # seconds of matmul per token
                2 * head / peak,  # seconds of LM head per sampled token
                4 * s.num_layers * s.num_heads * s.head_dim / peak,  # seconds per attention pair
            ),
        )

    def step_time(self, plan: StepPlan) -> float:
        return self.time_for(*plan_shape(plan))

    def time_for(
        self,
        prefill_tokens: int,
        decodes: int,
        decode_context: int,
        prefill_context: int,
        prefill_pairs: int,
        num_prefills: int,
    ) -> float:
        """Seconds for a step of this shape (see the module docstring)."""
        tokens = prefill_tokens + decodes
        if tokens == 0:
            return 0.0
        weights, kv, per_token, per_sample, per_pair = self._k
        memory = weights + kv * (decode_context + prefill_context + decodes)
        compute = (
            per_token * tokens
            + per_sample * (decodes + num_prefills)  # logits only where a token is sampled
            + per_pair * (prefill_pairs + decode_context + decodes)
        )
        return (memory if memory > compute else compute) + self.overhead_s
