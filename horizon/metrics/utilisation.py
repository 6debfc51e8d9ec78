"""KV-cache utilisation over time: used blocks / all blocks, recorded once per step."""

from __future__ import annotations

import numpy as np

from horizon.metrics.records import RunRecords


def kv_utilisation(rec: RunRecords) -> tuple[np.ndarray, np.ndarray]:
    """(time, utilisation) per step, for plots: ``step_end`` and ``kv_used_blocks / num_kv_blocks``.

    Each value holds from its step's end until the next step's end (plot with a "post" step).
    Utilisation is NaN throughout when the run has no KV blocks.
    """
    t = np.asarray(rec.step_end, dtype=np.float64)
    if rec.num_kv_blocks <= 0:
        return t, np.full(len(t), np.nan)
    return t, rec.kv_used_blocks / rec.num_kv_blocks


def kv_utilisation_mean(rec: RunRecords) -> float:
    """Time-weighted mean utilisation over the engine's busy time.

    Each step's utilisation is weighted by its duration (``RunRecords.step_durations``); idle gaps
    between steps are left out (the engine runs nothing then). Falls back to the plain mean when
    every step has zero duration; NaN for a run without steps or KV blocks.
    """
    _, u = kv_utilisation(rec)
    if len(u) == 0 or rec.num_kv_blocks <= 0:
        return np.nan
    w = np.asarray(rec.step_durations(), dtype=np.float64)
    total = w.sum()
    return float((u * w).sum() / total) if total > 0 else float(u.mean())


def kv_utilisation_max(rec: RunRecords) -> float:
    """Peak utilisation over the run's steps (NaN for a run without steps or KV blocks)."""
    _, u = kv_utilisation(rec)
    return float(u.max()) if len(u) else np.nan
