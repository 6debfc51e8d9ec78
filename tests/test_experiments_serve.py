"""``experiments.serve``: the server with a policy built from the config groups, as simulator
runs build theirs (Horizon with its predictor and the slo preset's TTFT target), serving
through the engine's own process; and its errors."""

from __future__ import annotations

import httpx
from serve_fixtures import MODEL, over_http, settle, tiny_config_for_serving

from executor.serve.engine_child import EngineSpec
from executor.serve.server import start_process_server
from experiments.serve import main, serving_policy, split_argv
from horizon.policies.horizon import HorizonPolicy


def test_the_two_sides_of_the_separator():
    assert split_argv(["policy=horizon", "--", "--model", "tiny"]) == (
        ["policy=horizon"],
        ["--model", "tiny"],
    )
    assert split_argv(["policy=fcfs"]) == (["policy=fcfs"], [])


def test_horizon_from_its_config_serves_forced_lengths_in_the_engine_process():
    built = serving_policy(["policy=horizon_oracle", "model=qwen2.5-0.5b", "slo=h200_0.5b"])
    policy = built.policy
    assert isinstance(policy, HorizonPolicy) and type(built.predictor).__name__ == "OraclePredictor"
    assert policy.ttft_slo == 0.25  # the slo preset's TTFT target (the default: 1 s)
    spec = EngineSpec(MODEL, tiny_config_for_serving(), torch_threads=1, policy=policy)
    server = start_process_server(spec, MODEL)
    with over_http(server) as http:
        body = {"prompt": "forced", "max_tokens": 9, "min_tokens": 9, "ignore_eos": True}
        for _ in range(3):
            r = httpx.post(http.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        settle(server)
    assert server.live.records().num_requests == 3


def test_user_errors_are_one_line_and_exit_2(capsys):
    assert main(["policy=nosuch", "--", "--model", "tiny"]) == 2
    assert "policy/nosuch" in capsys.readouterr().err
    assert main(["policy=fcfs", "--", "--policy", "lpf"]) == 2
    assert "--policy" in capsys.readouterr().err
