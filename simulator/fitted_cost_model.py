"""A step cost model fitted to the engine's measured steps (a calibration CSV of executor.profiler).

Two regimes, each a linear model fitted by least squares on relative error:

* decode-only steps (a CUDA graph padded to ``horizon.step_buckets.decode_buckets``):
  ``t = a + b * bucket(decodes) + c * decodes + e * context``, i.e. a fixed cost (weights read,
  launches) plus a per-padded-row, a per-sequence and a per-KV-token cost;
* steps with a prefill chunk (a graph padded to ``mixed_token_buckets``): the roofline time of
  the step's shape (see ``RooflineCostModel``) plus linear terms in the padded token count,
  decodes, decode context, prefill tokens, prefill context (a chunk's queries walk its whole
  prefix: latency that grows with it even for a few tokens), attention pairs and chunk count,
  so a fixed overhead and the compute/bandwidth knee are both learned.

The profiler times ``ModelRunner.execute`` alone; ``simulator.engine_cost_model`` is fitted to
the engine's online steps instead (the scheduler's and policy's host time included).

``held_out_mape`` reports the 5-fold cross-validated error per regime; ``fit_report`` is what
the calibration records carry. The CSV's sidecar JSON (GPU, model shape, versions, date) names
what the model is for; ``shape`` must match it.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from horizon.model_shape import ModelShape, model_shape
from horizon.plan import PLAN_SHAPE_FIELDS, StepPlan, plan_shape
from horizon.step_buckets import bucket_of, decode_buckets, mixed_token_buckets
from simulator.cost_model import RooflineCostModel
from simulator.gpu import gpu_spec

_COLUMNS = (*PLAN_SHAPE_FIELDS, "step_s")


_DECODE_BUCKETS = decode_buckets(256)
_MIXED_BUCKETS = mixed_token_buckets(2048)


def _features(roof: RooflineCostModel, row: np.ndarray, prefill: bool) -> np.ndarray:
    p, d, dctx, pctx, pairs, n = row[:6]
    if not prefill:
        return np.array([1.0, bucket_of(int(d), _DECODE_BUCKETS), d, dctx])
    r = roof.time_for(int(p), int(d), int(dctx), int(pctx), int(pairs), int(n))
    return np.array([1.0, r, bucket_of(int(p + d), _MIXED_BUCKETS), d, dctx, p, pctx, pairs, n])


def _fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    w = 1.0 / y  # least squares on relative error
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return coef


@dataclass(frozen=True)
class FittedCostModel:
    """``step_time(plan)`` from a calibration CSV. Build with ``FittedCostModel.from_csv``."""

    path: str
    shape: ModelShape
    decode_coef: tuple[float, ...]
    prefill_coef: tuple[float, ...]
    meta: dict = field(default_factory=dict, compare=False)
    _roof: RooflineCostModel = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_roof", _roofline(self.shape))

    @classmethod
    def from_csv(cls, path: str, shape: str | None = None) -> FittedCostModel:
        """Fit to ``path``; ``shape`` (a preset name) defaults to the sidecar JSON's model.

        Raises:
            ValueError: a missing column, too few rows of a regime, or a shape mismatch.
        """
        rows, meta = _read(path)
        name = meta.get("model") if shape is None else shape
        if name is None:
            raise ValueError(f"{path}: no sidecar JSON names the model; pass shape=")
        if meta.get("model") not in (None, name):
            raise ValueError(f"{path} was measured on {meta['model']}, not {name}")
        roof = _roofline(model_shape(name))
        coefs = []
        for prefill in (False, True):
            sel = rows[(rows[:, 0] > 0) == prefill]
            if len(sel) < 8:
                raise ValueError(f"{path}: {len(sel)} rows of one regime; need >= 8")
            x = np.stack([_features(roof, r, prefill) for r in sel])
            coefs.append(tuple(float(c) for c in _fit(x, sel[:, 6])))
        return cls(str(path), model_shape(name), coefs[0], coefs[1], meta)

    def step_time(self, plan: StepPlan) -> float:
        return self.time_for(*plan_shape(plan))

    def time_for(
        self,
        prefill_tokens: int,
        decodes: int,
        decode_context: int,
        prefill_context: int,
        prefill_pairs: int,
        num_prefills: int,
    ) -> float:
        if prefill_tokens == 0 and decodes == 0:
            return 0.0
        row = np.array(
            [prefill_tokens, decodes, decode_context, prefill_context, prefill_pairs, num_prefills],
            dtype=np.float64,
        )
        prefill = prefill_tokens > 0
        coef = self.prefill_coef if prefill else self.decode_coef
        t = float(np.dot(coef, _features(self._roof, row, prefill)))
        return max(t, 1e-6)


def held_out_mape(path: str, shape: str | None = None, folds: int = 5, seed: int = 0) -> dict:
    """Cross-validated mean absolute percentage error per regime and overall."""
    rows, meta = _read(path)
    roof = _roofline(model_shape(shape or meta["model"]))
    out, errs_all = {}, []
    rng = np.random.default_rng(seed)
    for prefill, name in ((False, "decode"), (True, "prefill_or_mixed")):
        sel = rows[(rows[:, 0] > 0) == prefill]
        x = np.stack([_features(roof, r, prefill) for r in sel])
        y = sel[:, 6]
        idx = rng.permutation(len(sel))
        errs = []
        for k in range(folds):
            te = idx[k::folds]
            tr = np.setdiff1d(idx, te)
            coef = _fit(x[tr], y[tr])
            errs.extend(np.abs(x[te] @ coef - y[te]) / y[te])
        out[name] = round(100 * float(np.mean(errs)), 2)
        errs_all.extend(errs)
    out["all"] = round(100 * float(np.mean(errs_all)), 2)
    out["rows"] = len(rows)
    return out


def _roofline(shape: ModelShape) -> RooflineCostModel:
    """The roofline feature: the H200 figures the calibration files were measured on."""
    return RooflineCostModel(shape, gpu_spec("H200"), overhead_s=0.0)


def _read(path: str) -> tuple[np.ndarray, dict]:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"calibration file {path} does not exist")
    with open(p, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}")
        rows = np.array([[float(r[c]) for c in _COLUMNS] for r in reader], dtype=np.float64)
    side = p.with_suffix(".json")
    meta = json.loads(side.read_text()) if side.exists() else {}
    return rows, meta
