"""SimPy twin of the engine: horizon's Scheduler over a modelled step clock."""

from simulator.cost_model import CostModel, RooflineCostModel
from simulator.cost_models import make_cost_model
from simulator.gpu import GpuSpec, gpu_spec
from simulator.replay_cost_model import ReplayCostModel, ReplayMismatch
from simulator.simulation import Simulation

__all__ = [
    "CostModel",
    "GpuSpec",
    "ReplayCostModel",
    "ReplayMismatch",
    "RooflineCostModel",
    "Simulation",
    "gpu_spec",
    "make_cost_model",
]
