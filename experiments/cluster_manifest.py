"""Cluster cases as one JSON file that ``experiments.cluster_engine_replay`` runs on the engine.

The GPU machine has neither hydra nor simpy nor the data sets: this module imports only the
standard library at import time (``horizon``, ``executor`` lazily). The format::

    {"format": "horizon-cluster-manifest", "version": 1,
     "model": "qwen2.5-0.5b",                 # a preset name, or a HF config.json dict
     "engine": {"num_blocks": 4000, "max_num_batched_tokens": 2048},   # EngineConfig fields
     "replicas": [{"device": "cuda:0", "engine": {"num_blocks": 8000}, "name": "big"},
                  {"device": "cuda:0"}],       # or a count: "replicas": 4, "device": "cuda"
     "ttft_slo": 0.25,                         # for policies and routers that take one
     "cases": [{"name": "rr", "requests": "requests.json.gz", "sessions": null,
                "router": {"name": "round_robin", "options": {}},
                "policy": {"name": "fcfs", "options": {}, "predictor": null,
                           "predictor_options": {}},
                "view_delay": 0.0, "max_time": null}],
     "notes": {"commit": "abc123"}}

Each replica's EngineConfig is ``engine`` updated by its own ``engine``; a case names a
``requests_file`` and / or a ``sessions_file`` (paths relative to the manifest), a router by
name (``horizon.cluster.routers``) and a policy as the fidelity manifest stores one
(``experiments.fidelity_manifest.PolicySpec``: built by the one policy factory).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from experiments.fidelity_manifest import PolicySpec

FORMAT = "horizon-cluster-manifest"
VERSION = 1


@dataclass(frozen=True)
class RouterSpec:
    """A router by registered name or ``package.module:Class``, with its options."""

    name: str
    options: dict = field(default_factory=dict)

    def build(self, ttft_slo: float):  # noqa: ANN201 - a horizon.cluster Router
        """A fresh router; one that takes ``ttft_slo`` gets the manifest's unless given."""
        from horizon.cluster.routers import ROUTERS
        from horizon.registry import takes

        options = dict(self.options)
        if takes(ROUTERS.resolve(self.name), "ttft_slo"):
            options.setdefault("ttft_slo", ttft_slo)
        return ROUTERS.make(self.name, **options)


@dataclass(frozen=True)
class ReplicaEntry:
    """One replica: its device ("cuda:<n>", "cuda", "cpu"), EngineConfig overrides, label and
    role (``mixed``, ``prefill`` or ``decode``: disaggregated serving)."""

    device: str = "cuda"
    engine: dict = field(default_factory=dict)
    name: str | None = None
    role: str = "mixed"


@dataclass(frozen=True)
class ClusterCase:
    """One run: its workload files, router, every replica's policy, view delay and cut-off."""

    name: str
    router: RouterSpec
    policy: PolicySpec = field(default_factory=lambda: PolicySpec("fcfs"))
    requests: str | None = None  # a requests_file, relative to the manifest
    sessions: str | None = None  # a sessions_file, relative to the manifest
    view_delay: float = 0.0
    max_time: float | None = None
    decode_router: RouterSpec | None = None  # replicas with prefill/decode roles need one

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"case.name must be a plain directory name, got {self.name!r}")
        if self.requests is None and self.sessions is None:
            raise ValueError(f"case {self.name}: give requests or sessions (or both)")
        if not isinstance(self.view_delay, (int, float)) or self.view_delay < 0:
            raise ValueError(f"case {self.name}: view_delay must be >= 0, got {self.view_delay!r}")
        if self.max_time is not None and not self.max_time > 0:
            raise ValueError(f"case {self.name}: max_time must be > 0, got {self.max_time!r}")


@dataclass(frozen=True)
class ClusterManifest:
    """Model, replicas and cases (see the module docstring)."""

    model: str | dict
    replicas: tuple[ReplicaEntry, ...]
    cases: tuple[ClusterCase, ...]
    engine: dict = field(default_factory=dict)
    ttft_slo: float = 1.0
    notes: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError("manifest.replicas must name at least one replica")
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError(f"manifest.cases: case names must be distinct, got {names}")

    def engine_config(self, i: int):  # noqa: ANN201 - an executor.engine.EngineConfig
        """Replica ``i``'s EngineConfig: the shared fields updated by its own.

        Raises:
            ValueError: an unknown EngineConfig field (named) or a value out of range.
        """
        known = {f.name for f in dataclasses.fields(_engine_config_class())}
        for where, given in (("engine", self.engine), (f"replicas[{i}].engine",
                                                       self.replicas[i].engine)):  # fmt: skip
            unknown = sorted(set(given) - known)
            if unknown:
                raise ValueError(f"manifest.{where}: unknown EngineConfig fields {unknown}")
        kw = {**self.engine, **self.replicas[i].engine}
        if "graph_batch_sizes" in kw:
            kw["graph_batch_sizes"] = tuple(kw["graph_batch_sizes"])
        return _engine_config_class()(**kw)

    def model_config(self):  # noqa: ANN201 - an executor.model.ModelConfig
        from executor.model import ModelConfig

        if isinstance(self.model, str):
            return ModelConfig.for_preset(self.model)
        return ModelConfig.from_hf_config(dict(self.model), self.model.get("_name_or_path"))

    def worker_specs(self, device: str | None = None) -> list:
        """One ``executor.cluster_worker.WorkerSpec`` per replica (``device`` overrides all)."""
        from executor.cluster_worker import WorkerSpec

        model = self.model_config()
        return [
            WorkerSpec(model, self.engine_config(i), device or r.device, r.name, r.role)
            for i, r in enumerate(self.replicas)
        ]

    def save(self, path: str | Path) -> None:
        doc = {"format": FORMAT, "version": VERSION, **asdict(self)}
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ClusterManifest:
        """Raises ValueError: not such a file, or a field out of range (named)."""
        try:
            doc = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file ({e})") from e
        if (
            not isinstance(doc, dict)
            or doc.get("format") != FORMAT
            or doc.get("version") != VERSION
        ):
            raise ValueError(f"{path} is not a {FORMAT} v{VERSION} file")
        for key in ("model", "replicas", "cases"):
            if key not in doc:
                raise ValueError(f"{path}: manifest.{key} is missing")
        return cls(
            model=doc["model"],
            replicas=_replicas(doc["replicas"], doc.get("device", "cuda")),
            cases=tuple(_case(c) for c in doc["cases"]),
            engine=doc.get("engine", {}),
            ttft_slo=doc.get("ttft_slo", 1.0),
            notes=doc.get("notes", {}),
        )


def _replicas(value: object, device: str) -> tuple[ReplicaEntry, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"manifest.replicas must be >= 1, got {value}")
        return tuple(ReplicaEntry(device) for _ in range(value))
    if not isinstance(value, list):
        raise ValueError(f"manifest.replicas must be a count or a list, got {value!r}")
    return tuple(ReplicaEntry(**r) for r in value)


def _case(c: dict) -> ClusterCase:
    c = dict(c)
    if "router" not in c:
        raise ValueError(f"case {c.get('name')!r}: case.router is missing")
    router = c.pop("router")
    router = RouterSpec(router) if isinstance(router, str) else RouterSpec(**router)
    policy = c.pop("policy", "fcfs")
    policy = PolicySpec(policy) if isinstance(policy, str) else PolicySpec(**policy)
    dec = c.pop("decode_router", None)
    dec = RouterSpec(dec) if isinstance(dec, str) else None if dec is None else RouterSpec(**dec)
    return ClusterCase(router=router, policy=policy, decode_router=dec, **c)


def _engine_config_class():  # noqa: ANN202
    from executor.engine import EngineConfig

    return EngineConfig
