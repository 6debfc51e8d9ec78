"""experiments.gain_misses: every request is good or misses for exactly one reason."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from experiments.components import build_components
from experiments.gain_misses import breakdown
from experiments.gain_settings import ROWS
from experiments.policy_gain import compose_rows
from experiments.runner import simulate
from experiments.workloads import DataSources, make_workload
from horizon.metrics import lifetime_good


@pytest.mark.parametrize(("rate", "max_time"), [(20.0, None), (400.0, 3.0)])
def test_outcomes_partition_the_requests(rate, max_time):
    cfg = compose_rows("poisson", {"fcfs": ROWS["fcfs"]}, [])["fcfs"]
    cfg = replace(cfg, rate=rate, num_requests=300, backend=replace(cfg.backend, max_time=max_time))
    sources = DataSources(cfg.data)
    parts = build_components(cfg, sources)
    rec = simulate(cfg, make_workload(cfg, sources), parts).records
    b = breakdown(rec, parts.slo)
    total = b["goodput"] + b["unfinished"] + b["ttft_miss"] + b["itl_miss"]
    assert total == pytest.approx(1.0)
    good = lifetime_good(rec, parts.slo)
    assert b["goodput"] == pytest.approx(good.mean())
    # the quartiles' goodputs average back to the whole (equal-sized up to ties)
    assert min(b["goodput_by_output_quartile"]) <= b["goodput"] + 1e-9
    assert max(b["goodput_by_output_quartile"]) >= b["goodput"] - 1e-9
    if (
        max_time is not None
    ):  # overloaded with a 3 s limit: some requests never finish or start late
        assert b["unfinished"] + b["ttft_miss"] > 0.2
    else:
        assert b["goodput"] > 0.9 and np.isfinite(b["goodput_by_prompt_quartile"]).all()
