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

Every coefficient is >= 0: each term is work. Built with ``fit``; rows are
``simulator.engine_cost_model.STEP_COLUMNS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from horizon.model_shape import model_shape
from horizon.plan import StepPlan
from horizon.step_buckets import bucket_of
from simulator.engine_cost_model import Buckets, _fit_mape

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
    """``step_time(plan)`` from physical features; build with ``fit``."""

    coef: tuple[float, ...]
    kv_bytes_per_token: int
    buckets: Buckets = DEFAULT_BUCKETS

    def __post_init__(self) -> None:
        if len(self.coef) != len(TERMS):
            raise ValueError(
                f"PhysicalCostModel.coef needs {len(TERMS)} values, got {len(self.coef)}"
            )
        if min(self.coef) < 0:
            raise ValueError("PhysicalCostModel.coef must be >= 0")

    @classmethod
    def fit(  # noqa: ANN206
        cls, rows: np.ndarray, model: str = "qwen2.5-7b", buckets: Buckets = DEFAULT_BUCKETS
    ):
        """Fit to ``STEP_COLUMNS`` rows (steps without a token ignored). Raises ValueError for
        fewer than 20 such rows."""
        rows = rows[(rows[:, 0] + rows[:, 1]) > 0]
        if len(rows) < 20:
            raise ValueError(f"PhysicalCostModel.fit needs >= 20 steps, got {len(rows)}")
        kvb = model_shape(model).kv_bytes_per_token()
        x = physical_features(rows, buckets, kvb)
        coef = _fit_mape(x, rows[:, -1], nonneg=True)
        return cls(tuple(float(c) for c in np.maximum(coef, 0.0)), kvb, buckets)

    @property
    def max_num_seqs(self) -> int:
        return self.buckets.max_num_seqs

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        x = physical_features(rows, self.buckets, self.kv_bytes_per_token)
        return np.maximum(x @ np.array(self.coef), 1e-6)

    def step_time(self, plan: StepPlan) -> float:
        d, p = len(plan.decodes), plan.num_prefill_tokens
        if p == 0 and d == 0:
            return 0.0
        row = np.array(
            [
                [
                    p,
                    d,
                    plan.decode_context_tokens,
                    plan.prefill_context_tokens,
                    plan.prefill_attention_pairs,
                    len(plan.prefills),
                    plan.num_refreshed,
                    1.0 if plan.preempted else 0.0,
                    0.0,
                ]
            ],
            dtype=np.float64,
        )
        return float(self.predict_rows(row)[0])

    def report(self) -> dict:
        return dict(zip(TERMS, self.coef))
