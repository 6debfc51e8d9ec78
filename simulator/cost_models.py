"""Cost models by name (a fitted model registers here once it exists)."""

from __future__ import annotations

from horizon.registry import Registry
from simulator.cost_model import CostModel, RooflineCostModel


def _builtin() -> Registry[CostModel]:
    reg: Registry[CostModel] = Registry("cost model")
    reg.register("roofline", RooflineCostModel)
    return reg


COST_MODELS = _builtin()  # read-only after import: a table of constructors, no run state


def make_cost_model(name: str, **options: object) -> CostModel:
    """Build a cost model by name, e.g.
    ``make_cost_model("roofline", shape=model_shape("qwen2.5-7b"), gpu=gpu_spec("H200"))``."""
    return COST_MODELS.make(name, **options)
