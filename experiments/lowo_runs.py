"""The engine runs leave-one-workload-out judges, and each re-simulated with a held-out fit.

An engine run (``Run``) is one ``<engine dir>/<case>/<policy>/records.npz`` of a ``Source``: a
folder of engine runs and the manifest their requests were exported with. The requests are
rebuilt as ``experiments.fidelity compare`` rebuilds them (the exported manifest, or a seeded
export where it is absent) and checked against the run's (``check_same_requests``); the
simulator then runs them as the engine ran them (``simulate_engine_loop``: the manifest's
scheduler and policy, arrivals between steps, the engine's loop, its time limit).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from experiments.fidelity_compare import (
    check_same_requests,
    engine_pipelined,
    in_band,
    simulate_engine_loop,
)
from experiments.fidelity_manifest import Case, Manifest
from horizon.metrics import summarize
from horizon.metrics.records import RunRecords
from horizon.request import SLO
from horizon.workload.requests_file import load_requests

REPO = Path(__file__).resolve().parents[1]
NOT_WORKLOADS = ("probe_", "anchor_")  # the speed probe and the lease's anchor case
SENSITIVITY = (0.99, 1.01)  # uniform step biases of -1% and +1%
CLIFF_PTS = 3.0  # a run is on a cliff when a 1% bias moves its goodput more (issue 23)


@dataclass(frozen=True)
class Source:
    """A folder of engine runs (``<case>/<policy>/``) and which manifest made them:
    ``"fidelity"`` (``experiments.fidelity``'s preset), ``"lowo"``
    (``experiments.lowo_workloads``), a manifest file's path (``.json``), or None: steps only
    (a repeat of another source's runs, not re-simulated). Runs of one source share a machine
    lease, hence one speed offset."""

    engine_dir: str
    manifest: str | None

    @functools.cached_property
    def manifest_path(self) -> Path:
        """The manifest, exported (seeded: the same requests) where it is absent."""
        if str(self.manifest).endswith(".json"):
            return Path(str(self.manifest))
        model = _model_of(Path(self.engine_dir))
        if self.manifest == "fidelity":
            from experiments.fidelity import export, preset

            path = REPO / preset(model).out / "manifest.json"
            if not path.exists():
                export(str(path.parent), model)
        else:
            from experiments.lowo_workloads import export

            path = REPO / "gpu_inputs" / "lowo" / model / "manifest.json"
            if not path.exists():
                export(model, str(path.parent))
        return path

    @functools.cached_property
    def loaded(self) -> Manifest:
        return Manifest.load(self.manifest_path)

    @functools.cached_property
    def cases(self) -> dict[str, Case]:
        return {c.name: c for c in self.loaded.cases}


@dataclass(frozen=True, eq=False)
class Run:
    source: Source
    case: str
    policy: str
    records: RunRecords

    @property
    def workload(self) -> str:
        """``first``, ``multi``, ``longout``...: the case name less ``cal_`` and ``_r<rate>``."""
        return self.case.removeprefix("cal_").split("_r")[0]

    @property
    def name(self) -> str:
        return f"{self.case}/{self.policy}"


def _model_of(engine_dir: Path) -> str:
    meta = next(iter(sorted(engine_dir.glob("*/*/meta.json"))))
    return json.loads(meta.read_text())["model"]


def load_runs(sources: tuple[Source, ...]) -> list[Run]:
    """Every run of the sources whose folder exists (the probe's and anchor's included)."""
    out = []
    for s in sources:
        for path in sorted(Path(s.engine_dir).glob("*/*/records.npz")):
            case, policy = path.parent.parent.name, path.parent.name
            out.append(Run(s, case, policy, RunRecords.load_npz(str(path))))
    return out


def is_workload(run: Run) -> bool:
    return not run.case.startswith(NOT_WORKLOADS)


def simulate(run: Run, cost_model) -> RunRecords:  # noqa: ANN001 - a CostModel
    """``run``'s requests on the simulator with ``cost_model``, as the engine ran them."""
    s = run.source
    m, case = s.loaded, s.cases[run.case]
    requests = load_requests(s.manifest_path.parent / case.requests)
    check_same_requests(run.records, requests, run.case)
    meta = json.loads((Path(s.engine_dir) / run.case / run.policy / "meta.json").read_text())
    pipelined = engine_pipelined(meta.get("engine") or {})
    return simulate_engine_loop(
        requests, m, m.policies[run.policy], cost_model, case.max_time, pipelined
    )


def slo_of(run: Run) -> SLO:
    m = run.source.loaded
    return SLO(m.ttft_slo, m.itl_slo)


def compare_run(run: Run, fits: dict, offset: float, noise_seeds: tuple[int, ...] = ()) -> dict:
    """``run`` on the engine against the simulator with each of ``fits`` (cost models fitted
    without its workload) scaled by the lease's ``offset``: signed relative errors of mean
    TTFT, ITL and E2E, the goodput gap (points, sim - engine), the 1% cliff sensitivity
    (the largest goodput move under a uniform -1% / +1% step bias, the physical model's) and,
    with ``noise_seeds``, the physical fit's scatter band: its goodput (min, max) over the
    seeds with its training steps' scatter resampled (``with_noise``), and whether the
    engine's goodput lies in it (``fidelity_compare.in_band``)."""
    slo = slo_of(run)
    eng = summarize(run.records, slo=slo)
    row = {"case": run.case, "policy": run.policy, "workload": run.workload,
           "goodput_measured": eng["goodput_lifetime"]}  # fmt: skip
    for name, model in fits.items():
        sim = summarize(simulate(run, model.scaled(offset)), slo=slo)
        row[f"goodput_sim_{name}"] = sim["goodput_lifetime"]
        row[f"goodput_err_pts_{name}"] = 100 * (sim["goodput_lifetime"] - eng["goodput_lifetime"])
        for k in ("ttft_mean", "itl_mean", "e2e_mean"):
            row[f"{k}_err_{name}"] = sim[k] / eng[k] - 1
    base = row["goodput_sim_physical"]
    moved = [
        summarize(simulate(run, fits["physical"].scaled(offset * f)), slo=slo)["goodput_lifetime"]
        for f in SENSITIVITY
    ]
    row["cliff_pts"] = max(100 * abs(g - base) for g in moved)
    row["on_cliff"] = row["cliff_pts"] > CLIFF_PTS
    if noise_seeds:
        noisy = fits["physical"].scaled(offset)
        band = [
            summarize(simulate(run, noisy.with_noise(seed)), slo=slo)["goodput_lifetime"]
            for seed in noise_seeds
        ]
        row["goodput_band_physical"] = (min(band), max(band))
        row["in_band_physical"] = in_band(eng["goodput_lifetime"], (min(band), max(band)))
    return row
