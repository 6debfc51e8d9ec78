"""Registers the typed schemas with Hydra's ConfigStore (the only module-level registration).

``configs/run.yaml`` and ``configs/sweep.yaml`` start their defaults lists with ``run_schema`` /
``sweep_schema``, so every group's YAML is merged over a typed node: a wrong type
(``rate=abc``) or an unknown key (``model.foo=1``) fails while composing, and
``OmegaConf.to_object`` then builds the frozen dataclasses, whose checks name the field.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.config import RunConfig, SweepConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def run_config(overrides: list[str]) -> RunConfig:
    """``configs/run.yaml`` composed with Hydra ``overrides`` (e.g. ``policy=horizon``), as the
    frozen, checked ``RunConfig`` (outside a Hydra app: for commands that are not one)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("run", overrides=overrides))
    assert isinstance(cfg, RunConfig)
    return cfg


def register_configs() -> None:
    """Store ``run_schema``, ``sweep_schema`` and ``cluster_run_schema`` (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=_writable(OmegaConf.structured(RunConfig)))
    cs.store(name="sweep_schema", node=_writable(OmegaConf.structured(SweepConfig)))
    from experiments.cluster_config import ClusterRunConfig  # (pulls in the simulator)

    cs.store(name="cluster_run_schema", node=_writable(OmegaConf.structured(ClusterRunConfig)))


def _writable(node: DictConfig) -> DictConfig:
    # OmegaConf marks nodes of frozen dataclasses read-only, which would stop Hydra from merging
    # the YAML groups into them. The objects built from the composed config stay frozen.
    # (_get_node: the nested nodes are still MISSING here, which the public getters refuse.)
    OmegaConf.set_readonly(node, False)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _writable(child)
    return node
