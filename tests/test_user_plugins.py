"""A policy from the researcher's own code: serially, under joblib and submitit, and by path.

``tests/fixtures/user_lab/`` stands for a researcher's project: a package ``mylab`` with a
policy class, and a config directory with ``policy/mylab_lwf.yaml``. Nothing of it is in
Horizon's registry; the commands run from that directory, as a researcher would run them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.policy_config import PolicyConfig
from experiments.policy_factory import build_policy
from horizon.registry import Registry

LAB = Path(__file__).parent / "fixtures" / "user_lab"
SMALL = ["rate=200", "num_requests=60", "model.num_blocks=120"]


def lab_run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", "--config-dir", "configs", *args],
        cwd=LAB,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def summaries(sweep_dir: Path) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))
    }


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_own_policy_runs_in_a_parallel_sweep(tmp_path, tiny_sharegpt, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    proc = lab_run(
        "-m",
        "policy=mylab_lwf,fcfs",
        f"hydra/launcher={launcher}",
        *extra,
        *SMALL,
        *tiny_sharegpt,
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr
    runs = summaries(tmp_path)
    assert sorted(runs) == ["0_mylab_lwf_rate200.0_seed0", "1_fcfs_rate200.0_seed0"]
    own = runs["0_mylab_lwf_rate200.0_seed0"]["run"]
    assert own["policy"] == "mylab.policies.LeastWorkFirst"
    assert own["policy_options"] == {"weight": 0.5}  # its parameters reached it
    assert own["policy_label"] == "LeastWorkFirst(weight=0.5)"
    assert runs["1_fcfs_rate200.0_seed0"]["run"]["policy"] == "fcfs"


def test_own_policy_by_import_path_in_a_single_run(tmp_path, tiny_sharegpt):
    proc = lab_run(
        "policy.name=mylab.policies:LeastWorkFirst",
        "+policy.options.weight=2.0",
        *SMALL,
        *tiny_sharegpt,
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr
    run = json.loads((tmp_path / "summary.json").read_text())["run"]
    assert run["policy"] == "mylab.policies:LeastWorkFirst" and run["policy_options"] == {
        "weight": 2.0
    }
    assert "LeastWorkFirst(weight=2)" in (tmp_path / "run.log").read_text()  # run.log is kept


def test_a_failed_job_is_named_and_the_others_keep_their_results(tmp_path, tiny_sharegpt):
    proc = lab_run(
        "-m",
        "policy=mylab_lwf",
        "policy.options.weight=0.5,-1",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        *SMALL,
        *tiny_sharegpt,
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 1
    assert "1 job(s) of the sweep" in proc.stderr
    assert "1_mylab_lwf_rate200.0_seed0: policy.options.weight must be >= 0, got -1" in (
        proc.stderr
    )
    assert list(summaries(tmp_path)) == ["0_mylab_lwf_rate200.0_seed0"]
    assert (tmp_path / "1_mylab_lwf_rate200.0_seed0" / "error.txt").is_file()


def test_registries_resolve_import_paths_and_say_what_is_wrong():
    reg: Registry[object] = Registry("widget")
    reg.register("plain", dict)
    assert reg.make("plain", a=1) == {"a": 1}
    assert reg.make("collections:OrderedDict", b=2) == {"b": 2}
    assert reg.make("collections.OrderedDict") == {}  # hydra's _target_ spelling
    with pytest.raises(ValueError, match=r"unknown widget 'nope'; known: plain \(or 'package"):
        reg.resolve("nope")
    with pytest.raises(ValueError, match=r"widget 'no_such_pkg.mod:X': cannot import"):
        reg.resolve("no_such_pkg.mod:X")
    with pytest.raises(ValueError, match=r"widget 'collections:Nope': 'collections' has no"):
        reg.resolve("collections:Nope")
    with pytest.raises(ValueError, match="is not a class or a function"):
        reg.resolve("math:pi")
    with pytest.raises(ValueError, match="must not contain ':'"):
        reg.register("a:b", dict)


def test_the_factory_fills_what_a_policy_takes_from_the_run():
    from predictors import make_predictor

    oracle = make_predictor("oracle")
    built = build_policy(
        PolicyConfig("horizon", {"headroom": 0.1}, {"name": "oracle"}), 0.7, lambda _: oracle
    )
    assert built.predictor is oracle and built.policy.ttft_slo == 0.7
    with pytest.raises(ValueError, match="policy.predictor: policy 'fcfs' takes no predictor"):
        PolicyConfig("fcfs", predictor={"name": "oracle"})
    with pytest.raises(ValueError, match="policy 'horizon' needs a predictor"):
        PolicyConfig("horizon")
    with pytest.raises(ValueError, match="not a horizon Policy subclass"):
        PolicyConfig("collections:OrderedDict")
    with pytest.raises(ValueError, match="give name or _target_, not both"):
        PolicyConfig("fcfs", _target_="horizon.policies.fcfs.FCFS")
    assert PolicyConfig(_target_="horizon.policies.fcfs.FCFS").name == (
        "horizon.policies.fcfs.FCFS"
    )
