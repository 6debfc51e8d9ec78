"""Cost models by name (a fitted model registers here once it exists)."""

from __future__ import annotations

from horizon.model_shape import ModelShape
from horizon.registry import Registry
from simulator.cost_model import CostModel, RooflineCostModel
from simulator.fitted_cost_model import FittedCostModel
from simulator.gpu import GpuSpec


def _builtin() -> Registry[CostModel]:
    reg: Registry[CostModel] = Registry("cost model")
    reg.register("roofline", RooflineCostModel)
    reg.register("fitted", _fitted)
    return reg


def _fitted(shape: ModelShape, gpu: GpuSpec, path: str) -> CostModel:
    """``fitted``: a calibration CSV measured on ``gpu`` for ``shape`` (checked)."""
    model = FittedCostModel.from_csv(path, shape.name)
    measured = str(model.meta.get("gpu", ""))
    if measured and gpu.name not in measured:
        raise ValueError(f"{path} was measured on {measured}, not {gpu.name}")
    return model


COST_MODELS = _builtin()  # read-only after import: a table of constructors, no run state


def make_cost_model(name: str, **options: object) -> CostModel:
    """Build a cost model by name, e.g.
    ``make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))``."""
    return COST_MODELS.make(name, **options)
