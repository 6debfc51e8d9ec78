"""A tensor-parallel step's cost: one rank's roofline plus the step's all-reduces.

The split is the engine's (``executor/tensor_parallel.py``, Megatron's): each rank keeps
``num_heads / world`` query heads with the QKV and output projections' matching rows and
columns, ``intermediate_size / world`` of the MLP, and its KV heads (``num_kv_heads / world``;
one, replicated on ``world / num_kv_heads`` ranks, where there are fewer KV heads than ranks);
embedding, norms and LM head are whole on every rank. ``rank_shape`` is that part as a
``ModelShape``, so its ``weight_bytes``, ``kv_bytes_per_token`` and ``matmul_params`` are one
rank's: the per-rank price is ``RooflineCostModel`` on it (each rank reads its share of the
weights, its heads' KV, and does its share of the FLOPs plus the whole LM head).

Each layer sums its two row-parallel projections across ranks (after attention and after the
MLP): ``2 x num_layers`` all-reduces of ``tokens x hidden_size x dtype_bytes`` each, priced
as a ring (the alpha-beta model)::

    all_reduce(bytes) = launch_s + 2 (world - 1) hop_s + 2 (world - 1) / world x bytes / bandwidth

``bandwidth`` is the link's per-direction bandwidth (``simulator.kv_link``: NVLink 450 GB/s on
an H200), the bus bandwidth a ring can reach at best. The latency is an assumption until TP
steps are measured: a line through NVIDIA/nccl-tests issue #123's small-message (8-128 B) Ring
all-reduces with one channel on a DGX-A100 (10.0, 16.9, 33.7 us at 2, 4, 8 GPUs): 5.6 us plus
2.0 us per ring hop. The all-reduces do not overlap compute: the engine's forward waits for
each one before the next layer, so a step's time is the sum::

    t = rank_scale x roofline(rank) + latency_scale x latency + bytes_scale x bytes_time
        + overhead_s

World 1 has no all-reduce and prices a step exactly as ``RooflineCostModel`` does. The four
coefficients are 1, 1, 1 and the roofline's 0.5 ms until ``fit`` sets them (non-negative,
relative error) from measured steps of at least two world sizes (``TP_STEP_COLUMNS``): with
one, the all-reduce latency and the step overhead are the same constant.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from horizon.model_shape import ModelShape
from horizon.plan import StepPlan, plan_shape
from simulator.cost_model import RooflineCostModel
from simulator.engine_cost_model import STEP_COLUMNS
from simulator.gpu import GpuSpec
from simulator.kv_link import LinkSpec, link_spec

TP_STEP_COLUMNS = ("world", *STEP_COLUMNS)  # a measured TP step: its world size, then its row
COEFFICIENTS = ("rank_scale", "latency_scale", "bytes_scale", "overhead_s")
LAUNCH_S = 5.6e-6  # NVIDIA/nccl-tests#123 (DGX-A100, Ring, 1 channel): an assumption for H200
HOP_S = 2.0e-6


def rank_shape(shape: ModelShape, world: int) -> ModelShape:
    """One rank's part of ``shape`` at tensor-parallel size ``world`` (the module docstring);
    ``shape`` itself at world 1. Raises ValueError naming ``world`` and the dimension it does
    not split (the engine's rules, ``executor.tensor_parallel.layout``)."""
    if not (isinstance(world, int) and not isinstance(world, bool) and world >= 1):
        raise ValueError(f"TensorParallelCostModel.world must be an int >= 1, got {world!r}")
    if world == 1:
        return shape
    h, k, i = shape.num_heads, shape.num_kv_heads, shape.intermediate_size
    for name, v in (("num_heads", h), ("intermediate_size", i)):
        if v % world:
            raise ValueError(
                f"TensorParallelCostModel.world {world} does not divide {shape.name}'s {name} {v}"
            )
    if (k >= world and k % world) or (k < world and world % k):
        raise ValueError(
            f"TensorParallelCostModel.world {world} does not split {shape.name}'s "
            f"num_kv_heads {k} (neither divides the other)"
        )
    return dataclasses.replace(
        shape,
        name=f"{shape.name}/tp{world}",
        num_heads=h // world,
        num_kv_heads=max(k // world, 1),
        intermediate_size=i // world,
    )


def ring_factor(world: int) -> float:
    """Bytes a ring all-reduce moves per rank and direction, per byte reduced."""
    return 2 * (world - 1) / world


@dataclass(frozen=True)
class TensorParallelCostModel:
    """``step_time(plan)`` of a TP group of ``world`` GPUs ``gpu`` running ``shape``.

    Contracts: pure in the plan's shape; 0 for an empty plan, else > 0; at ``world`` 1 with
    unit scales equal to ``RooflineCostModel(shape, gpu, overhead_s, dtype_bytes)``.
    ``link``: a ``LinkSpec`` or a ``simulator.kv_link`` preset's name. Raises ValueError
    naming the field for a world that does not split the shape, a negative coefficient or
    latency, an unknown link.
    """

    shape: ModelShape
    gpu: GpuSpec
    world: int = 1
    link: LinkSpec | str = "nvlink"
    allreduce_launch_s: float = LAUNCH_S
    allreduce_hop_s: float = HOP_S
    rank_scale: float = 1.0
    latency_scale: float = 1.0
    bytes_scale: float = 1.0
    overhead_s: float = 0.0005
    dtype_bytes: int = 2
    meta: dict = field(default_factory=dict, compare=False)
    _rank: RooflineCostModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.link, str):
            object.__setattr__(self, "link", link_spec(self.link))
        for name in ("allreduce_launch_s", "allreduce_hop_s", *COEFFICIENTS):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"TensorParallelCostModel.{name} must be >= 0, got {v!r}")
        part = rank_shape(self.shape, self.world)
        object.__setattr__(self, "_rank", RooflineCostModel(part, self.gpu, 0.0, self.dtype_bytes))

    @property
    def rank_weight_bytes(self) -> int:
        """Weight bytes one rank holds and reads once per step."""
        return self._rank.shape.weight_bytes(self.dtype_bytes)

    @property
    def weight_read_s(self) -> float:
        """The per-rank weight-read roofline: one rank's weight bytes over the GPU's bandwidth."""
        return self.rank_weight_bytes / self.gpu.mem_bandwidth

    @property
    def num_all_reduces(self) -> int:
        """All-reduces per step: two per layer, none at world 1."""
        return 0 if self.world == 1 else 2 * self.shape.num_layers

    def all_reduce_latency_s(self) -> float:
        """A step's all-reduces' latency (unscaled): count x (launch + 2 (world-1) hops)."""
        hops = 2 * (self.world - 1)
        return self.num_all_reduces * (self.allreduce_launch_s + hops * self.allreduce_hop_s)

    def all_reduce_bytes_s(self, tokens: int) -> float:
        """A step's all-reduces' bandwidth time (unscaled) for ``tokens`` tokens."""
        nbytes = tokens * self.shape.hidden_size * self.dtype_bytes
        bw = self.link.bandwidth  # type: ignore[union-attr]  # a LinkSpec after __post_init__
        return self.num_all_reduces * ring_factor(self.world) * nbytes / bw

    def terms(self, *shape: int) -> tuple[float, float, float]:
        """(rank roofline, all-reduce latency, all-reduce bytes time) of a step of this plan
        shape (``PLAN_SHAPE_FIELDS``), unscaled: what ``COEFFICIENTS`` multiply."""
        tokens = shape[0] + shape[1]
        if tokens == 0:
            return 0.0, 0.0, 0.0
        return (
            self._rank.time_for(*shape),
            self.all_reduce_latency_s(),
            self.all_reduce_bytes_s(tokens),
        )

    def time_for(self, *shape: int) -> float:
        """Seconds of a step of this plan shape (``PLAN_SHAPE_FIELDS``)."""
        if shape[0] + shape[1] == 0:
            return 0.0
        rank, latency, nbytes = self.terms(*shape)
        t = self.rank_scale * rank + self.latency_scale * latency + self.bytes_scale * nbytes
        return t + self.overhead_s

    def step_time(self, plan: StepPlan) -> float:
        return self.time_for(*plan_shape(plan))

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        """Seconds of each ``STEP_COLUMNS`` row (its first six columns) at this world."""
        return np.array([self.time_for(*(int(v) for v in r[:6])) for r in rows])

    def coefficients(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in COEFFICIENTS}

    @classmethod
    def fit(  # noqa: ANN206
        cls, rows: np.ndarray, shape: ModelShape, gpu: GpuSpec, world: int | None = None, **kw
    ):
        """The model at ``world`` (default: the rows' largest) with ``COEFFICIENTS`` fitted to
        measured TP steps, ``TP_STEP_COLUMNS`` rows (steps without a token ignored), each
        >= 0, minimising the squared relative error. ``kw``: the other fields (link,
        latencies, dtype_bytes, meta). Raises ValueError for fewer than 8 steps or steps of
        fewer than two world sizes."""
        from simulator.tp_fit import fit_coefficients  # numpy/scipy work kept apart

        coef, worlds = fit_coefficients(cls, rows, shape, gpu, **kw)
        r, lat, nbytes, over = (coef[name] for name in COEFFICIENTS)
        w = max(worlds) if world is None else world
        return cls(shape, gpu, w, **kw, rank_scale=r, latency_scale=lat, bytes_scale=nbytes,
                   overhead_s=over)  # fmt: skip
