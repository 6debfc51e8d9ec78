"""The cluster run's typed config: per-replica overrides, errors that name the field, and the
hydra groups compose over the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.cluster_config import ClusterRunConfig, ClusterSpec
from experiments.cluster_setup import ReplicaSpec
from experiments.config_store import register_configs

REPO = Path(__file__).resolve().parents[1]


def test_overrides_make_a_heterogeneous_cluster():
    spec = ClusterSpec(
        3, ReplicaSpec(num_blocks=3000), {"1": {"num_blocks": 6000, "shape": "qwen2.5-0.5b"}}
    )
    blocks = [(s.num_blocks, s.shape) for s in spec.specs()]
    assert blocks == [(3000, "qwen2.5-7b"), (6000, "qwen2.5-0.5b"), (3000, "qwen2.5-7b")]


def test_bad_fields_are_named():
    with pytest.raises(ValueError, match="cluster.overrides"):
        ClusterSpec(2, overrides={"5": {}})
    with pytest.raises(ValueError, match="cluster.replicas"):
        ClusterSpec(0)
    with pytest.raises(ValueError, match="traffic"):
        ClusterRunConfig(traffic="bursty")
    with pytest.raises(ValueError, match="ReplicaSpec.num_blocks"):
        ReplicaSpec(num_blocks=0)


def test_the_groups_compose_into_the_typed_config():
    register_configs()
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("cluster_run", ["router=prefix_aware", "cluster=sixteen_7b", "load=30"])
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, ClusterRunConfig)
    assert run.router.name == "prefix_aware" and run.router.options == {"threshold": 8}
    assert run.cluster.replicas == 16 and run.cluster.replica.num_blocks == 121709


def test_a_replica_names_its_gpu_s_sharing_rule():
    from simulator.device_sharing import DeviceSpec

    opts = {"sharing": "quantum", "quantum_s": 2.5e-4}
    spec = ReplicaSpec(num_blocks=100, device="gpu0", device_options=opts)
    assert spec.setup().device == DeviceSpec("gpu0", "quantum", quantum_s=2.5e-4)
    assert ReplicaSpec(num_blocks=100, device="gpu0").setup().device == "gpu0"
    with pytest.raises(ValueError, match="ReplicaSpec.device_options need a device"):
        ReplicaSpec(device_options=opts)
    with pytest.raises(ValueError, match="ReplicaSpec.device_options"):
        ReplicaSpec(device="gpu0", device_options={"slice": 1e-3})
    with pytest.raises(ValueError, match="DeviceSpec.quantum_s"):
        ReplicaSpec(device="gpu0", device_options={"sharing": "quantum"})
