"""WorkloadConfig validation: every bad field is named; combinations are checked."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from horizon.workload import WorkloadConfig
from horizon.workload.filters import LengthFilter


def test_defaults_are_valid_and_vllm_like():
    cfg = WorkloadConfig()
    assert (cfg.source, cfg.mode, cfg.arrival) == ("sharegpt", "first_turn", "poisson")
    assert cfg.max_output_tokens == 2048 and cfg.multi_turn_concurrency == 16
    assert (cfg.min_prompt_tokens, cfg.min_output_tokens) == (4, 4)
    assert (cfg.max_prompt_tokens, cfg.max_total_tokens) == (1024, 2048)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        WorkloadConfig().rate = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"rate": -1.0}, "rate"),
        ({"rate": math.nan}, "rate"),
        ({"rate": math.inf}, "rate"),
        ({"rate": 0}, "rate"),
        ({"burstiness": 0.0}, "burstiness"),
        ({"trace_rate_scale": -2.0}, "trace_rate_scale"),
        ({"mode": "all_turns"}, "mode"),
        ({"source": "lmsys"}, "source"),
        ({"arrival": "uniform"}, "arrival"),
        ({"num_requests": 0}, "num_requests"),
        ({"num_requests": 10.0}, "num_requests"),
        ({"seed": -1}, "seed"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"min_prompt_tokens": -1}, "min_prompt_tokens"),
        ({"max_prompt_tokens": 0}, "max_prompt_tokens"),
        ({"max_total_tokens": 1.5}, "max_total_tokens"),
        ({"multi_turn_concurrency": 0}, "multi_turn_concurrency"),
        ({"slo_ttft": -1.0, "slo_itl": 0.1}, "slo_ttft"),
        ({"slo_ttft": 1.0}, "slo_ttft"),  # itl missing
        ({"arrival": "trace"}, "trace_path"),
        ({"source": "azure"}, "trace_path"),
        ({"source": "azure", "trace_path": "t.csv", "mode": "multi_turn"}, "mode"),
        ({"min_prompt_tokens": 100, "max_prompt_tokens": 10}, "min_prompt_tokens"),
        ({"min_output_tokens": 100, "max_output_tokens": 10}, "min_output_tokens"),
        ({"trace_path": 3}, "trace_path"),
    ],
)
def test_bad_field_is_named(kwargs, field):
    with pytest.raises(ValueError, match=f"WorkloadConfig.{field}"):
        WorkloadConfig(**kwargs)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="first_turn, multi_turn"):
        WorkloadConfig(mode="x")


def test_filters_may_be_disabled_and_paths_become_strings():
    cfg = WorkloadConfig(
        min_prompt_tokens=None,
        min_output_tokens=None,
        max_prompt_tokens=None,
        max_total_tokens=None,
        trace_path=Path("a/b.csv"),  # type: ignore[arg-type]
        arrival="trace",
    )
    assert cfg.trace_path == "a/b.csv"
    limits = LengthFilter.from_config(cfg)
    assert limits.drop_reason(1, 1, 1) is None
    assert limits.drop_reason(5, 100_000, 100_000) is None


def test_length_filter_reasons_in_order():
    limits = LengthFilter.from_config(WorkloadConfig())
    assert limits.drop_reason(0, 10, 10) == "zero_prompt"
    assert limits.drop_reason(5, 10, 0) == "zero_output"
    assert limits.drop_reason(5, 10, 3) == "output_too_short"
    assert limits.drop_reason(2, 3, 10) == "prompt_too_short"
    assert limits.drop_reason(5, 1025, 10) == "prompt_too_long"
    assert limits.drop_reason(5, 1024, 1025) == "total_too_long"
    assert limits.drop_reason(5, 1024, 1024) is None
    # total uses the capped output: 100 + min(5000, 2048) > 2048, 0 + ... kept at the cap
    assert limits.drop_reason(5, 100, 5000) == "total_too_long"
    assert limits.capped(5000) == 2048 and limits.capped(7) == 7
    no_total = dataclasses.replace(limits, max_total_tokens=None)
    assert no_total.drop_reason(5, 100, 5000) is None
