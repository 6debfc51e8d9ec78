"""A replica's own part of its steps when it shares a GPU with other replicas (variant (d)).

On a time-sliced GPU (``simulator.device_sharing``) a step's time is its own part plus whole
slices of its busy neighbours' steps. ``ColocatedCostModel`` prices the own part, fitted to the
co-located engine's steps themselves (``experiments.colocated_fit``; coefficients in
``results/cluster_fidelity/colocated_fit.json``) rather than to one replica alone on the GPU;
its terms are the engine cost model's (``simulator.engine_cost_model``: a graph intercept per
decode bucket, decodes and decode context; for steps with prefill chunks padded and real
tokens, attention pairs and context read including a cached prefix, decodes, chunks, context
per decode). ``slice_counts`` gives the shares of 1..4 slices a mixed step took at each own
time, as measured against this model, for the device to draw from (``SliceCounts``).

A fit file holds folds (``fold``): ``all`` (every co-located case), ``without_load<i>`` (every
case but those at load ``i`` of their grid) and ``without_<workload>`` (the other workload's
cases only), so a comparison can price each case with a model that never saw it.

Loadable by path: ``make_cost_model("simulator.colocated_cost_model:ColocatedCostModel",
fold="without_load1")``.
"""

from __future__ import annotations

import json
from pathlib import Path

from horizon.plan import StepPlan
from simulator.device_sharing import DeviceSpec, SliceCounts
from simulator.engine_cost_model import Buckets, EngineCostModel

FIT_FILE = (
    Path(__file__).resolve().parents[1] / "results" / "cluster_fidelity" / "colocated_fit.json"
)


class ColocatedCostModel:
    """``step_time(plan)``: the step's own part on a shared GPU (seconds), of fit ``fold``.

    Contracts: ``step_time`` is a pure function of the plan (0 for an empty plan, else > 0);
    ``slice_counts(seed)`` is the fold's ``SliceCounts``; ``device(name, seed)`` a
    ``timeslice`` ``DeviceSpec`` drawing from them. Raises ValueError naming the fold when the
    file has no such fold."""

    def __init__(self, path: str | Path = FIT_FILE, fold: str = "all", **_: object) -> None:
        doc = json.loads(Path(path).read_text())
        folds = {f["fold"]: f for f in doc["folds"]}
        if fold not in folds:
            raise ValueError(f"ColocatedCostModel.fold {fold!r}: {path} has {sorted(folds)}")
        f = folds[fold]
        b = doc.get("buckets", {})
        self.fold = fold
        self.source = str(doc.get("source", path))
        self._model = EngineCostModel(
            tuple(float(v) for v in f["decode_coef"]),
            tuple(float(v) for v in f["mixed_coef"]),
            Buckets(**b) if b else Buckets(),
        )
        self._edges = tuple(float(v) for v in doc["slice_edges_s"])
        self._probs = tuple(tuple(float(v) for v in row) for row in f["slice_probs"])
        self.max_num_seqs = self._model.max_num_seqs

    def step_time(self, plan: StepPlan) -> float:
        return self._model.step_time(plan)

    def predict_rows(self, rows):  # noqa: ANN001, ANN201 - STEP_COLUMNS rows -> seconds
        return self._model.predict_rows(rows)

    def slice_counts(self, seed: int = 0) -> SliceCounts:
        return SliceCounts(self._edges, self._probs, seed, f"{self.source} ({self.fold})")

    def device(self, name: str = "gpu0", seed: int = 0) -> DeviceSpec:
        return DeviceSpec(name, "timeslice", self.slice_counts(seed))
