"""Hydra configs -> typed run configs: composition, derived values and clear errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from experiments.components import build_components, kv_num_blocks
from experiments.config import RunConfig, SweepConfig
from experiments.config_store import register_configs
from experiments.sweep import grid_policies
from experiments.workloads import DataSources, make_workload

REPO = Path(__file__).resolve().parents[1]
TRACE_DIR = REPO.parent / "shared" / "data"


def typed(*overrides: str, name: str = "run"):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return OmegaConf.to_object(compose(name, overrides=list(overrides)))


def test_defaults_compose_into_frozen_typed_config():
    cfg = typed()
    assert isinstance(cfg, RunConfig)
    assert (cfg.policy.name, cfg.model.shape, cfg.slo.name) == ("fcfs", "qwen2.5-7b", "h200_7b")
    assert cfg.scheduler.block_size == 16 and cfg.scheduler.enable_prefix_caching
    with pytest.raises(AttributeError):
        cfg.rate = 3.0  # type: ignore[misc]


def test_group_options_and_values_override():
    cfg = typed("policy=sjf_prompt", "policy.options.aging_tokens_per_s=5", "rate=7", "seed=3")
    assert cfg.policy.options == {"aging_tokens_per_s": 5.0}
    assert cfg.policy.label == "sjf_prompt(aging_tokens_per_s=5)"
    assert (cfg.rate, cfg.seed) == (7.0, 3)


def test_defaults_are_the_documented_kv_bound_setting():
    cfg = typed()
    assert cfg.model.num_blocks == 3000 and cfg.num_requests == 4000 and cfg.rate == 60.0
    assert (cfg.workload.conversations, cfg.workload.split_test_fraction) == ("held_out", 0.5)
    horizon = typed("policy=horizon")  # a learned predictor runs with the defaults
    assert horizon.policy.predictor_config.learns
    assert horizon.workload == cfg.workload  # every policy sees the same requests


def test_num_blocks_derived_from_gpu_memory_not_written_back():
    cfg = typed("model.num_blocks=null")
    assert cfg.model.num_blocks is None
    # floor((141e9 * 0.9 - 15.23e9 weight bytes) / (16 * 57344 KV bytes per token))
    assert kv_num_blocks(cfg.model, 16) == 121709
    assert build_components(cfg).scheduler.num_blocks == 121709
    assert cfg.model.num_blocks is None
    assert kv_num_blocks(replace(cfg.model, num_blocks=3000), 16) == 3000


def test_sweep_config_sets_kv_bound_blocks_and_grid():
    cfg = typed("sweep=quick", name="sweep")
    assert isinstance(cfg, SweepConfig)
    assert cfg.model.num_blocks == 3000
    run = cfg.run_config(rate=5.0, seed=1)
    assert isinstance(run, RunConfig) and run.rate == 5.0 and not hasattr(run, "sweep")


def test_unknown_policy_option_lists_known_options():
    with pytest.raises(MissingConfigException, match="policy/nope"):
        typed("policy=nope")


def test_unknown_policy_name_gives_registry_error():
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; known: fcfs"):
        typed("policy.name=nope")


def test_bad_policy_option_names_it():
    with pytest.raises(ValueError, match="sjf_prompt.aging_tokens_per_s"):
        typed("policy=sjf_prompt", "policy.options.aging_tokens_per_s=-1")


@pytest.mark.parametrize("rate", ["-5", "0", "inf"])
def test_non_positive_rate_names_field(rate):
    with pytest.raises(ValueError, match=r"^rate must be a finite number > 0"):
        typed(f"rate={rate}")


def test_unknown_model_option_and_shape():
    with pytest.raises(MissingConfigException, match="model/gpt-9"):
        typed("model=gpt-9")
    with pytest.raises(ValueError, match=r"unknown model shape 'gpt-9'; known: llama-3-8b"):
        typed("model.shape=gpt-9")


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("model.gpu_memory_utilization=1.5", "model.gpu_memory_utilization"),
        ("model.num_blocks=0", "model.num_blocks"),
        ("model.gpu=A100", "unknown GPU 'A100'"),
        ("backend.step_mode=fast", "backend.step_mode"),
        ("seed=-1", "seed must be"),
        ("num_requests=0", "num_requests must be"),
        ("workload.mode=all_turns", "WorkloadConfig.mode"),
        ("scheduler.max_num_seqs=0", "SchedulerConfig.max_num_seqs"),
        ("slo.itl=0", "SLO.itl"),
    ],
)
def test_bad_values_name_the_field(override, match):
    with pytest.raises(ValueError, match=match):
        typed(override)


def test_slo_preset_must_match_model():
    with pytest.raises(ValueError, match="slo preset 'h200_7b' is for qwen2.5-7b"):
        typed("model=qwen2.5-0.5b")
    assert typed("model=qwen2.5-0.5b", "slo=h200_0.5b").slo.itl == 0.01


def test_sweep_grid_rejects_overrides_it_sets():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("sweep", overrides=["sweep=quick"]))
        with pytest.raises(ValueError, match="rate is set by the sweep grid"):
            grid_policies(cfg, ["sweep=quick", "rate=5"])
        policies = grid_policies(cfg, ["sweep=quick"])
    assert list(policies) == ["fcfs", "sjf_prompt"]
    assert policies["sjf_prompt"].options == {"aging_tokens_per_s": 100.0}


def test_sweep_grid_checks_values():
    with pytest.raises(ValueError, match="sweep.rates has duplicates"):
        typed("sweep=quick", "sweep.rates=[1,1]", name="sweep")
    with pytest.raises(MissingConfigException, match="policy/nope"):
        register_configs()
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = OmegaConf.to_object(compose("sweep", overrides=["sweep.policies=[nope]"]))
            grid_policies(cfg, [])


@pytest.mark.skipif(not TRACE_DIR.is_dir(), reason=f"Azure traces not found at {TRACE_DIR}")
@pytest.mark.parametrize("rate", [2.0, 50.0])
def test_trace_replay_is_scaled_to_the_rate(rate):
    cfg = typed(
        "workload=azure_conv", f"data.trace_dir={TRACE_DIR}", f"rate={rate}", "num_requests=300"
    )
    workload = make_workload(cfg, DataSources(cfg.data))
    assert workload.stats["arrival_rate"] == pytest.approx(rate)
    assert workload.stats["trace_rate_scale"] == pytest.approx(
        rate / workload.stats["trace_native_rate"]
    )
    assert workload.stats["trace_path"] == str(TRACE_DIR / "AzureLLMInferenceTrace_conv.csv.gz")
