"""Fairness: Jain's index over per-request slowdowns.

Slowdown (defined here, once):

    slowdown_i = E2E_i / ideal_i
    ideal_i    = min_steps_i * d
    min_steps_i = ceil(prompt_tokens_i / B) + (output_tokens_i - 1)

with B the run's median step token budget and d the run's median step duration. ``min_steps`` is
the fewest engine steps a request needs on its own: its prompt in chunks of at most B tokens (the
last chunk emits the first token), then one decode step per further token. Multiplying by one
run-wide step time turns it into a time without a cost model. Only finished requests have a
slowdown (E2E is defined for them only); prefix-cache hits are ignored.

Because ``d`` is one constant per run and Jain's index is scale-invariant, ``fairness_jain`` does
not depend on d at all: it compares E2E per unit of each request's own minimum work. The slowdown
values themselves are relative to the run's typical step (a loaded step is slower than an idle
one, so a slowdown can dip below 1) and are comparable within a run, not across runs.
"""

from __future__ import annotations

import numpy as np

from horizon.metrics.latency import e2e, num_tokens
from horizon.metrics.records import RunRecords


def min_steps(rec: RunRecords) -> np.ndarray:
    """Fewest engine steps each request needs alone (float; NaN for a run without steps)."""
    budget = float(np.median(rec.token_budget)) if len(rec.token_budget) else np.nan
    if not budget > 0:
        return np.full(rec.num_requests, np.nan)
    prefill_steps = np.ceil(rec.num_prompt_tokens / budget)
    return prefill_steps + np.maximum(num_tokens(rec) - 1, 0)


def slowdown(rec: RunRecords) -> np.ndarray:
    """E2E / (min_steps * median step duration) per request; NaN unless finished."""
    durations = rec.step_durations()
    d = float(np.median(durations)) if len(durations) else np.nan
    if not d > 0:
        return np.full(rec.num_requests, np.nan)
    return e2e(rec) / (min_steps(rec) * d)


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2) over the non-NaN values of ``x``.

    1 when all values are equal, 1/n when one value is non-zero. NaN when there is no value or
    all are 0 (undefined).

    Raises:
        ValueError: when a value is negative (the index is for non-negative quantities).
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if np.any(x < 0):
        raise ValueError("Jain's index needs non-negative values")
    sq = float((x * x).sum())
    if x.size == 0 or sq == 0:
        return np.nan
    return float(x.sum() ** 2 / (x.size * sq))


def fairness_jain(rec: RunRecords) -> float:
    """Jain's index over the slowdowns of finished requests."""
    return jain_index(slowdown(rec))
