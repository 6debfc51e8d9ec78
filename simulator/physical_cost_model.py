"""A step cost priced by physics: what a step reads and computes, with coefficients fitted
(non-negative, minimising relative error) to measured engine steps.

One regime for every step::

    t = a_graph * [decode-only] + a_mixed * [mixed] + w * padded_tokens
        + k * kv_gb + q * attention_pairs + h * requests + r * refreshed + s * preempting

* ``a_graph`` / ``a_mixed``: the weights read once per step and the launch of the captured graph
  (decode-only graphs and mixed graphs are captured apart, so each has its own constant);
* ``padded_tokens``: tokens of the step padded to its captured bucket (the linear layers' FLOPs
  run on the padded rows);
* ``kv_gb``: KV bytes read, (decode context + prefill context) x the model shape's KV bytes per
  token, in GB: the one term that grows with context, priced per byte so longer contexts than
  calibrated cost what the bytes cost;
* ``attention_pairs``: the prefill chunks' query x key pairs (attention FLOPs);
* ``requests`` (decodes + chunks), ``refreshed``: host work per request.

Every coefficient is >= 0: each term is work. Built with ``fit`` (rows are
``simulator.engine_cost_model.STEP_COLUMNS``) or ``from_file`` (a calibration file of
``write_steps``); the simulator's ``physical`` cost model loads it fitted once per file
(``simulator.cost_model_artifact.load_physical``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from horizon.model_shape import model_shape
from horizon.plan import StepPlan
from horizon.step_buckets import bucket_of
from simulator.engine_cost_model import Buckets, _fit_mape, read_steps

DEFAULT_BUCKETS = Buckets()
TERMS = (
    "decode_graph",
    "mixed_graph",
    "padded_tokens",
    "kv_gb",
    "attention_pairs",
    "requests",
    "refreshed",
    "preempting",
)


def physical_features(rows: np.ndarray, buckets: Buckets, kv_bytes_per_token: int) -> np.ndarray:
    """``[steps, len(TERMS)]`` features of ``STEP_COLUMNS`` rows."""
    p, d, dctx, pctx, pairs, n, ref, pre = (rows[:, i] for i in range(8))
    mixed = (p > 0).astype(np.float64)
    db, mb = buckets.decode, buckets.mixed
    padded = np.array(
        [bucket_of(int(pi + di), mb) if pi > 0 else bucket_of(int(di), db) for pi, di in zip(p, d)],
        dtype=np.float64,
    )
    kv_gb = (dctx + pctx) * kv_bytes_per_token / 1e9
    cols = [1.0 - mixed, mixed, padded, kv_gb, pairs, d + n, ref, (pre > 0).astype(np.float64)]
    return np.stack(cols, axis=1)


@dataclass(frozen=True)
class PhysicalCostModel:
    """``step_time(plan)`` from physical features; build with ``fit`` or ``from_file``.

    ``coef``: seconds per unit of each of ``TERMS`` (all >= 0); ``kv_bytes_per_token``: the
    model shape's, which turns context tokens into bytes read.
    """

    coef: tuple[float, ...]
    kv_bytes_per_token: int
    buckets: Buckets = DEFAULT_BUCKETS
    meta: dict = field(default_factory=dict, compare=False)
    # where it came from (``simulator.cost_model_artifact``): files and their SHA-256
    provenance: dict | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.coef) != len(TERMS):
            raise ValueError(
                f"PhysicalCostModel.coef needs {len(TERMS)} values, got {len(self.coef)}"
            )
        if min(self.coef) < 0:
            raise ValueError("PhysicalCostModel.coef must be >= 0")

    @classmethod
    def fit(  # noqa: ANN206
        cls,
        rows: np.ndarray,
        model: str = "qwen2.5-7b",
        buckets: Buckets = DEFAULT_BUCKETS,
        meta: dict | None = None,
    ):
        """Fit to ``STEP_COLUMNS`` rows (steps without a token ignored) of the shape ``model``.
        Raises ValueError for fewer than 20 such rows."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        if len(rows) < 20:
            raise ValueError(f"PhysicalCostModel.fit needs >= 20 steps, got {len(rows)}")
        kvb = model_shape(model).kv_bytes_per_token()
        x = physical_features(rows, buckets, kvb)
        coef = _fit_mape(x, rows[:, -1], nonneg=True)
        return cls(tuple(float(c) for c in np.maximum(coef, 0.0)), kvb, buckets, dict(meta or {}))

    @classmethod
    def from_file(cls, path: str | Path, model: str) -> PhysicalCostModel:
        """Fit to a calibration file of ``write_steps`` (its sidecar JSON gives the buckets)
        measured on the shape ``model``. Raises ValueError for a missing or malformed file."""
        rows, meta = read_steps(path)
        b = meta.get("buckets", {})
        return cls.fit(rows, model, Buckets(**b) if b else DEFAULT_BUCKETS, meta)

    @property
    def max_num_seqs(self) -> int:
        return self.buckets.max_num_seqs

    def scaled(self, factor: float) -> PhysicalCostModel:
        """This model with every step ``factor`` times as long (a uniform bias)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be finite and > 0, got {factor!r}")
        return replace(self, coef=tuple(c * factor for c in self.coef))

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        x = physical_features(rows, self.buckets, self.kv_bytes_per_token)
        return np.maximum(x @ np.array(self.coef), 1e-6)

    def step_time(self, plan: StepPlan) -> float:
        """The step's seconds: ``predict_rows`` of its row, in scalar arithmetic (the
        simulator calls this once per step)."""
        d, p = len(plan.decodes), plan.num_prefill_tokens
        if p == 0 and d == 0:
            return 0.0
        c = self.coef
        if p > 0:
            t = c[1] + c[2] * bucket_of(p + d, self._mixed)
        else:
            t = c[0] + c[2] * bucket_of(d, self._decode)
        ctx = plan.decode_context_tokens + plan.prefill_context_tokens
        t += c[3] * (ctx * self.kv_bytes_per_token / 1e9) + c[4] * plan.prefill_attention_pairs
        t += c[5] * (d + len(plan.prefills)) + c[6] * plan.num_refreshed
        t += c[7] if plan.preempted else 0.0
        return max(t, 1e-6)

    @functools.cached_property
    def _decode(self) -> tuple[int, ...]:
        return self.buckets.decode

    @functools.cached_property
    def _mixed(self) -> tuple[int, ...]:
        return self.buckets.mixed

    def report(self) -> dict:
        return dict(zip(TERMS, self.coef))
