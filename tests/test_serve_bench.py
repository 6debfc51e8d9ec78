"""The serving benchmark runs end to end on the tiny CPU model, both servers (the engine in
its own process and on a thread); its figures are for a GPU."""

from __future__ import annotations

import json

import torch

from executor.serve import bench

ARGS = (
    "--model tiny --device cpu --concurrency 2 --requests 4 --prompt-len 12 --output-len 8 "
    "--low-load-requests 2 --low-load-output 3 --block-size 4 --max-num-batched-tokens 32 "
    "--torch-threads 1 --engine thread,process"
)


def test_bench_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "serve_bench.json"
    threads = torch.get_num_threads()
    try:
        bench.main(ARGS.split() + ["--json-out", str(out)])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["concurrency"] == 2
    assert set(row["http"]) == {"thread", "process"}
    for http in row["http"].values():
        assert http["tokens"] == http["expected_tokens"] == 4 * 8  # forced lengths
        assert http["transport_errors"] == []
        assert http["tok_s"] > 0
    assert row["offline"]["tok_s"] > 0 < row["offline_serial"]["tok_s"]
    low = result["low_load"]
    assert min(low["http_ttft_p50_s"].values()) > 0 < low["offline_ttft_p50_s"]
    assert "http/offline" in capsys.readouterr().out
