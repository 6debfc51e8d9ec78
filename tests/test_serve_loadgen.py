"""The load-generator comparison's pure parts: GuideLLM's figures and the records' side."""

import numpy as np

from executor.serve.soak import parse_gauges
from experiments.serve_loadgen_compare import client_side, guidellm_rows, records_side


def _bench() -> dict:
    req = [
        {"time_to_first_token_ms": 100.0, "inter_token_latency_ms": 20.0, "request_latency": 2.0},
        {"time_to_first_token_ms": 1500.0, "inter_token_latency_ms": 10.0, "request_latency": 3.0},
        {"time_to_first_token_ms": 50.0, "inter_token_latency_ms": None, "request_latency": 0.1},
    ]
    return {
        "config": {"strategy": {"rate": 7.0}},
        "start_time": 10.0,
        "end_time": 20.0,
        "requests": {"successful": req, "errored": [{}], "incomplete": []},
    }


def test_client_side_from_guidellm_requests():
    rows = guidellm_rows(_bench())
    assert rows["rate"] == 7.0 and rows["errored"] == 1 and rows["incomplete"] == 0
    s = client_side(rows)
    assert s["requests"] == 3
    assert np.isclose(s["ttft_p50"], 0.1) and np.isclose(s["itl_mean"], 0.015)
    assert np.isclose(s["goodput_mean_itl"], 2 / 3)  # the 1.5 s TTFT misses; one token passes


def test_every_gap_goodput_is_stricter_than_mean_itl():
    r = {
        "ttft": np.array([0.1, 0.2, 0.3]),
        "itl_mean": np.array([0.01, 0.02, 0.03]),
        "itl_max": np.array([0.02, 0.08, 0.04]),  # the second request has one 80 ms gap
        "e2e": np.array([1.0, 2.0, 3.0]),
    }
    all3 = records_side(r, np.ones(3, bool))
    assert all3["goodput_mean_itl"] == 1.0 and np.isclose(all3["goodput_every_gap"], 2 / 3)
    assert records_side(r, np.array([True, False, False]))["goodput_every_gap"] == 1.0


def test_soak_reads_the_servers_gauges():
    text = (
        "# HELP vllm:num_requests_running x\nvllm:num_requests_running 0.0\n"
        'vllm:num_requests_waiting{model_name="m"} 3\nvllm:kv_cache_usage_perc 0.25\n'
    )
    g = parse_gauges(text)
    assert g == {
        "num_requests_running": 0.0,
        "num_requests_waiting": 3.0,
        "kv_cache_usage_perc": 0.25,
    }
