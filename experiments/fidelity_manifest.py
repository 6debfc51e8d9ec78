"""The fidelity experiment's cases as one JSON file both sides read: the simulator here and the
engine on the GPU machine (which has neither hydra nor the data sets, so this module imports
only the standard library and, lazily, ``horizon`` and ``predictors``).

A manifest names the model shape, one scheduler configuration, the SLO, the policies (registry
name, options, predictor) and the cases: a workload's requests (a ``requests_file``) at one load
and seed. Cases of role ``calibration`` give the steps the cost model is fitted to; cases of role
``fidelity`` are compared (their steps are the held-out set); the ``golden`` case is a small run
whose engine log the step-parity test replays.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = "horizon-fidelity-manifest"
VERSION = 1
ROLES = ("calibration", "fidelity", "golden", "headline")


@dataclass(frozen=True)
class PolicySpec:
    """A policy as a manifest stores it: a ``PolicyConfig`` whose predictor needs no training
    on the engine's machine (an oracle, or ``prepared`` predictions), flattened to JSON."""

    name: str
    options: dict = field(default_factory=dict)
    predictor: str | None = None
    predictor_options: dict = field(default_factory=dict)

    def config(self):  # noqa: ANN201 - an experiments.policy_config.PolicyConfig
        from experiments.policy_config import PolicyConfig

        predictor = None
        if self.predictor is not None:
            predictor = {"name": self.predictor, "options": dict(self.predictor_options)}
        return PolicyConfig(self.name, dict(self.options), predictor)

    def build(self, ttft_slo: float):  # noqa: ANN201 - a horizon Policy
        """A fresh policy, by the one factory (``experiments.policy_factory``)."""
        from experiments.policy_factory import build_policy, ready_predictor

        return build_policy(self.config(), ttft_slo, ready_predictor).policy


@dataclass(frozen=True)
class Case:
    name: str
    role: str
    workload: str
    rate: float
    seed: int
    requests: str  # file name, relative to the manifest
    policies: tuple[str, ...]
    max_time: float | None = None  # both sides stop at the first step boundary after it (s)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"case {self.name}: role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class Manifest:
    model: str
    scheduler: dict  # horizon.SchedulerConfig fields
    ttft_slo: float
    itl_slo: float
    policies: dict[str, PolicySpec]
    cases: tuple[Case, ...]
    notes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.cases:
            unknown = [p for p in c.policies if p not in self.policies]
            if unknown:
                raise ValueError(f"case {c.name}: unknown policies {unknown}")
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError("case names must be distinct")

    def scheduler_config(self):  # noqa: ANN201 - horizon SchedulerConfig
        from horizon.scheduler_config import SchedulerConfig

        return SchedulerConfig(**self.scheduler)

    def of_role(self, role: str) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.role == role)

    def save(self, path: str | Path) -> None:
        doc = {"format": FORMAT, "version": VERSION, **asdict(self)}
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file")
        return cls(
            model=doc["model"],
            scheduler=doc["scheduler"],
            ttft_slo=doc["ttft_slo"],
            itl_slo=doc["itl_slo"],
            policies={k: PolicySpec(**v) for k, v in doc["policies"].items()},
            cases=tuple(Case(**{**c, "policies": tuple(c["policies"])}) for c in doc["cases"]),
            notes=doc.get("notes", {}),
        )


def source_commit() -> str | None:
    """The commit the exporting checkout is at (``+dirty`` with uncommitted changes), or None
    outside a git checkout: kept in a manifest's notes, so that every engine run names the code
    that planned it (the engine's machine gets a copy of the tree without its history)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return (sha + ("+dirty" if dirty else "")) or None

