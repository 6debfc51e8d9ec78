"""Metrics of disaggregated serving: TTFT split into its parts, and goodput per GPU.

For a request handed off from a prefill to a decode replica, TTFT (arrival to first token) is
the sum of

    queueing      arrival -> first admission on its prefill replica
    prefill       -> its prompt computed (but the last token) and handed off: KV ready
    kv_wait       -> blocks reserved on a decode replica, transfer started (backpressure)
    transfer      -> its KV arrived on the decode replica
    first_decode  -> its first token (the last prompt token's step on the decode replica)

computed from the merged records and the transfers table. Requests not handed off (mixed
replicas, one-token prompts) or without a first token are NaN in every part.
"""

from __future__ import annotations

import numpy as np

from horizon.cluster.records import ClusterRecords
from horizon.metrics.goodput import SLOLike, lifetime_good
from horizon.metrics.latency import first_token_time
from horizon.metrics.throughput import duration

TTFT_PARTS = ("queueing", "prefill", "kv_wait", "transfer", "first_decode")


def ttft_parts(rec: ClusterRecords) -> dict[str, np.ndarray]:
    """Per request of ``rec.merged()`` (id order): each of ``TTFT_PARTS``, seconds."""
    merged = rec.merged()
    n = merged.num_requests
    out = {k: np.full(n, np.nan) for k in TTFT_PARTS}
    t = rec.transfers
    if t is None or not len(t["request_id"]):
        return out
    row = np.searchsorted(merged.request_id, t["request_id"])
    first = first_token_time(merged)[row]
    admit = merged.first_admit_time[row]
    out["queueing"][row] = admit - merged.arrival_time[row]
    out["prefill"][row] = t["ready"] - admit
    out["kv_wait"][row] = t["start"] - t["ready"]
    out["transfer"][row] = t["end"] - t["start"]
    out["first_decode"][row] = first - t["end"]
    return out


def ttft_breakdown(rec: ClusterRecords) -> dict[str, float]:
    """Mean of each TTFT part over the handed-off requests that got a first token (s), and
    how many they are."""
    parts = ttft_parts(rec)
    ok = np.isfinite(parts["first_decode"])
    out = {k: float(v[ok].mean()) if ok.any() else float("nan") for k, v in parts.items()}
    out["requests"] = int(ok.sum())
    return out


def goodput_per_gpu(rec: ClusterRecords, slo: SLOLike | None = None, gpus: int | None = None):  # noqa: ANN201
    """Requests that met every SLO per second of the run, per GPU (``gpus`` defaults to one
    per replica)."""
    merged = rec.merged()
    good = int(np.count_nonzero(lifetime_good(merged, slo)))
    span = duration(merged)
    return float(good / span / (gpus or rec.num_replicas)) if span > 0 else float("nan")
