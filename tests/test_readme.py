"""The README's examples run as written (so they cannot rot): the Python API example, and the
own-policy example (its class, its config file and its commands, from a project directory)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def blocks(section: str, lang: str) -> list[str]:
    """The ``lang`` code blocks of the README section headed ``section``."""
    text = README.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_python_api_example_prints_the_lifetime_goodput():
    (code,) = blocks("Simulate from Python", "python")
    assert len(code.strip().splitlines()) <= 15
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    goodput = float(proc.stdout.strip().splitlines()[-1])
    assert 0.0 < goodput < 1.0  # 60 req/s on 3,000 blocks: fcfs loses some, not all


def test_the_own_policy_example_runs_from_a_project_directory(tmp_path, tiny_sharegpt):
    section = "Your own policy, from your own code"
    (policy,) = blocks(section, "python")
    assert len(policy.strip().splitlines()) <= 25
    (config,) = blocks(section, "yaml")
    (commands,) = blocks(section, "bash")
    (tmp_path / "mylab").mkdir()
    (tmp_path / "mylab" / "__init__.py").write_text("")
    (tmp_path / "mylab" / "policies.py").write_text(policy)
    (tmp_path / "myconfigs" / "policy").mkdir(parents=True)
    (tmp_path / "myconfigs" / "policy" / "swf.yaml").write_text(config)
    small = ["num_requests=60", "model.num_blocks=120", *tiny_sharegpt]
    for i, line in enumerate(commands.strip().splitlines()):
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", "experiments.run"]
        out = tmp_path / f"out{i}"
        multirun = "-m" in argv[3:]
        where = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        proc = subprocess.run(
            [sys.executable, *argv[1:], *small, f"{where}={out}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        summaries = sorted(out.rglob("summary.json"))
        assert len(summaries) == (3 if multirun else 1)
        assert '"policy": "mylab.policies.ShortestWorkFirst"' in summaries[0].read_text()
        assert '"weight": 0.25' in summaries[0].read_text()
