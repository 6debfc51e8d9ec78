"""Cost models by name: roofline, fitted (profiler grid), engine_fitted and physical (online
steps), tensor_parallel (a TP group's roofline and all-reduces)."""

from __future__ import annotations

import json
from pathlib import Path

from horizon.model_shape import ModelShape
from horizon.registry import Registry
from simulator.clock_state import ClockStateCost, ClockTable
from simulator.cost_model import CostModel, RooflineCostModel
from simulator.cost_model_artifact import load_fitted, load_physical
from simulator.engine_cost_model import read_steps
from simulator.fitted_cost_model import FittedCostModel
from simulator.gpu import GpuSpec
from simulator.physical_cost_model import BUCKET_MIN_STEPS
from simulator.tp_cost_model import TensorParallelCostModel

HORIZON_ROOT = Path(__file__).resolve().parents[1]  # the checkout: calibration/ lives here


def shipped(path: str) -> str:
    """``path`` as given if it exists (or is absolute); else, if relative, the calibration file
    of that name shipped in the Horizon checkout: a run launched from another directory (a
    researcher's own project) still finds ``calibration/...``."""
    p = Path(path)
    if p.is_absolute() or p.exists() or not (HORIZON_ROOT / p).exists():
        return path
    return str(HORIZON_ROOT / p)


def _check_measured(meta: dict, path: str, shape: ModelShape, gpu: GpuSpec) -> None:
    """Raises ValueError where the file's ``meta`` names another model shape or GPU."""
    for key, want in (("model", shape.name), ("gpu", gpu.name)):
        got = str(meta.get(key, ""))
        if got and want not in got:
            raise ValueError(f"{path} was measured with {key} {got}, not {want}")


def _builtin() -> Registry[CostModel]:
    reg: Registry[CostModel] = Registry("cost model")
    reg.register("roofline", RooflineCostModel)
    reg.register("fitted", _fitted)
    reg.register("engine_fitted", _engine_fitted)
    reg.register("physical", physical)
    reg.register("tensor_parallel", TensorParallelCostModel)  # options: shape, gpu, world, link
    return reg


def physical(
    shape: ModelShape,
    gpu: GpuSpec,
    path: str,
    noise_seed: int | None = None,
    noise_block_steps: int = 2000,
    kv_floor: bool = True,
    clock: str | None = None,
    bucket_offsets: bool = False,
) -> CostModel:
    """``physical``: ``simulator.physical_cost_model.PhysicalCostModel`` fitted to an engine's
    online steps (the file ``engine_fitted`` reads), measured on ``gpu`` for ``shape``
    (checked); fitted once per file, shape and options (``cost_model_artifact.load_physical``).
    Also reachable as ``simulator.cost_models.physical`` (an import path, hydra's ``_target_``).

    ``kv_floor``: the KV bytes a step reads cost at least their time at ``gpu``'s memory
    bandwidth (no fit prices them lower). ``clock``: an ``executor.duty_cycle`` result file
    measured on ``gpu`` for ``shape``; the steps are priced as ``simulator.clock_state``'s
    ``ClockStateCost`` (the slowdown after compute-bound steps; one state per replica). The
    held-out validation (``docs/fidelity/lowo.md``) measured both. ``bucket_offsets``: each
    decode bucket with ``BUCKET_MIN_STEPS`` decode-only steps in the file gets an offset of its
    own (``PhysicalCostModel.decode_offsets``). ``noise_seed``: as
    ``engine_fitted``'s, the file's steps' scatter resampled; None: deterministic."""
    floor = 1e9 / gpu.mem_bandwidth if kv_floor else 0.0
    table = None
    if clock is not None:
        clock_path = shipped(clock)
        if not Path(clock_path).exists():
            raise ValueError(f"clock: duty-cycle file {clock} does not exist")
        _check_measured(json.loads(Path(clock_path).read_text()).get("meta", {}), clock, shape, gpu)
        table = ClockTable.from_duty_cycle(clock_path)
    min_steps = BUCKET_MIN_STEPS if bucket_offsets else 0
    model: CostModel = load_physical(shipped(path), shape.name, floor, table, min_steps)
    _check_measured(model.meta, path, shape, gpu)
    if noise_seed is not None:
        rows = read_steps(shipped(path))[0]
        rows = rows if table is None else table.deflate(rows)
        model = model.with_residuals(rows).with_noise(noise_seed, noise_block_steps)
    return model if table is None else ClockStateCost(model, table)


def _engine_fitted(
    shape: ModelShape,
    gpu: GpuSpec,
    path: str,
    noise_seed: int | None = None,
    noise_block_steps: int = 2000,
) -> CostModel:
    """``engine_fitted``: fitted to an engine's online steps (``experiments.fidelity compare``
    writes the file), measured on ``gpu`` for ``shape`` (checked); fitted once per file
    (``simulator.cost_model_artifact``). ``noise_seed``: time steps
    with a seeded block resampling of the measured scatter (``NoisyStepCost``, blocks of
    ``noise_block_steps`` decode steps); None: deterministic."""
    model = load_fitted(shipped(path), residuals=noise_seed is not None)
    _check_measured(model.meta, path, shape, gpu)
    return model if noise_seed is None else model.with_noise(noise_seed, noise_block_steps)


def _fitted(shape: ModelShape, gpu: GpuSpec, path: str) -> CostModel:
    """``fitted``: a calibration CSV measured on ``gpu`` for ``shape`` (checked)."""
    model = FittedCostModel.from_csv(shipped(path), shape.name)
    measured = str(model.meta.get("gpu", ""))
    if measured and gpu.name not in measured:
        raise ValueError(f"{path} was measured on {measured}, not {gpu.name}")
    return model


COST_MODELS = _builtin()  # read-only after import: a table of constructors, no run state


def make_cost_model(name: str, **options: object) -> CostModel:
    """Build a cost model by name, e.g.
    ``make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))``."""
    return COST_MODELS.make(name, **options)
