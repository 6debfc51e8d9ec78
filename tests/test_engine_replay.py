"""experiments/engine_replay.py on the CPU: a manifest's cases and policies, built by the one
policy factory, replayed online by the engine (a tiny model), records and meta written."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_engine_offline import make_model

import experiments.engine_replay as replay
from executor.engine import Engine, EngineConfig
from experiments.fidelity_manifest import Case, Manifest, PolicySpec
from horizon.metrics.records import RunRecords
from horizon.request import Request
from horizon.scheduler_config import SchedulerConfig
from horizon.workload.requests_file import save_requests


@pytest.fixture
def tiny_engine(monkeypatch):
    model = make_model()

    def engine(name: str, device: str, config: EngineConfig) -> Engine:
        assert (name, device) == ("tiny", "cpu")
        return Engine(model, config)

    monkeypatch.setattr(replay, "_engine", engine)


def test_a_manifest_replays_every_policy(tmp_path, tiny_engine):
    reqs = [Request(i, 0.01 * i, 5 + i % 4, 64, 3 + i % 3) for i in range(8)]
    save_requests(reqs, tmp_path / "reqs.json")
    sc = SchedulerConfig(num_blocks=64, block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                         max_model_len=128)  # fmt: skip
    policies = {
        "fcfs": PolicySpec("fcfs"),
        "horizon_oracle": PolicySpec("horizon", {"refresh_every": 2}, "oracle"),
    }
    case = Case("c", "fidelity", "synthetic", 100.0, 0, "reqs.json", tuple(policies))
    notes = {"commit": "abc1234"}  # what an export stamps: the code that planned the runs
    Manifest("tiny", dataclasses.asdict(sc), 1.0, 0.05, policies, (case,), notes).save(
        tmp_path / "manifest.json"
    )
    replay.replay_manifest(str(tmp_path / "manifest.json"), str(tmp_path / "out"), "cpu", None)
    for name in policies:
        d = tmp_path / "out" / "c" / name
        rec = RunRecords.load_npz(str(d / "records.npz"))
        rec.check()
        assert (rec.status == 0).all() and rec.num_requests == 8
        np.testing.assert_array_equal(rec.num_output_tokens, [r.true_output_tokens for r in reqs])
        meta = json.loads((d / "meta.json").read_text())
        assert (meta["case"], meta["policy"], meta["gpu"]) == ("c", name, "cpu")
        assert meta["commit"] == "abc1234"


def test_a_policy_by_name_gets_its_predictor_only_if_it_takes_one():
    assert type(replay._policy("fcfs", "oracle", 1.0)).__name__ == "FCFS"
    hz = replay._policy("horizon", "oracle", 0.5)
    assert hz.ttft_slo == 0.5 and type(hz.predictor).__name__ == "OraclePredictor"
    with pytest.raises(ValueError, match="needs a predictor"):
        replay._policy("horizon", None, 0.5)


def test_the_engine_side_builds_policies_without_the_simulators_stack(tmp_path):
    """The GPU machine has no simpy, hydra or scikit-learn: a manifest's policy with replayed
    predictions is built there without importing them (the file's own check is what fails)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('simpy', 'hydra', 'omegaconf', 'sklearn'): sys.modules[m] = None\n"
        "from experiments.fidelity_manifest import PolicySpec\n"
        f"spec = PolicySpec('horizon', {{}}, 'prepared', {{'path': {str(tmp_path / 'none')!r}}})\n"
        "try:\n"
        "    spec.build(1.0)\n"
        "except ModuleNotFoundError as e:\n"
        "    print('IMPORT', e); raise SystemExit(3)\n"
        "except (OSError, ValueError) as e:\n"
        "    print('FILE', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("FILE") and "none" in out.stdout
    oracle = code.replace("'prepared', {'path'", "'oracle', {'unused'").split("try:")[0]
    oracle = oracle.replace(", {'unused': " + repr(str(tmp_path / "none")) + "})", ", {})")
    ok = subprocess.run([sys.executable, "-c", oracle + "print(spec.build(1.0).name)"],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0 and ok.stdout.strip() == "horizon", ok.stderr
