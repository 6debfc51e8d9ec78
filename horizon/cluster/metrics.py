"""Cluster metrics: pure functions of ``ClusterRecords``.

* load imbalance: per-replica work (tokens computed: prefill chunks and decodes) as max / mean
  and coefficient of variation (0 = perfectly even);
* prefix-cache hit rate: prompt tokens served from cache over prompt tokens admitted (served
  from cache plus prefill tokens computed, recompute included), summed over replicas;
* routing decisions per second: routed requests over the router's own wall time;
* per-replica goodput (lifetime and TPOT) and request counts.
"""

from __future__ import annotations

import numpy as np

from horizon.cluster.records import ClusterRecords
from horizon.metrics import waste
from horizon.metrics.goodput import SLOLike, lifetime_good, tpot_good


def replica_work(rec: ClusterRecords) -> np.ndarray:
    """Tokens each replica computed (prefill and decode), in replica order."""
    return np.array([float(r.computed_tokens.sum()) for r in rec.replicas])


def imbalance(rec: ClusterRecords) -> dict[str, float]:
    """``max_over_mean`` and ``cv`` of per-replica work (1 and 0 when even or idle)."""
    work = replica_work(rec)
    mean = float(work.mean()) if len(work) else 0.0
    if mean <= 0:
        return {"max_over_mean": 1.0, "cv": 0.0}
    return {"max_over_mean": float(work.max() / mean), "cv": float(work.std() / mean)}


def prefix_hit_rate(rec: ClusterRecords) -> float:
    """The single-replica metric over the cluster's merged records (NaN if nothing prefilled)."""
    return waste.prefix_hit_rate(rec.merged())


def routing_rate(rec: ClusterRecords) -> float:
    """Routing decisions per wall second of routing (inf if too fast to time)."""
    n = int(np.count_nonzero(rec.assignment >= 0))
    return n / rec.route_wall_s if rec.route_wall_s > 0 else float("inf")


def per_replica(rec: ClusterRecords, slo: SLOLike | None = None) -> list[dict[str, float]]:
    """Requests, lifetime and TPOT goodput (share of the replica's requests), and work."""
    out = []
    work = replica_work(rec)
    for name, r, w in zip(rec.names, rec.replicas, work):
        n = r.num_requests
        out.append({
            "replica": name,
            "requests": n,
            "goodput": float(lifetime_good(r, slo).mean()) if n else float("nan"),
            "tpot_goodput": float(tpot_good(r, slo=slo).mean()) if n else float("nan"),
            "work_tokens": float(w),
        })  # fmt: skip
    return out


def cluster_summary(rec: ClusterRecords, slo: SLOLike | None = None) -> dict:
    """Cluster-level figures: goodput of both kinds over every arrived request, imbalance,
    prefix-cache hit rate, routing rate, and the per-replica table."""
    merged = rec.merged()
    n = merged.num_requests
    return {
        "replicas": rec.num_replicas,
        "requests": n,
        "goodput": float(lifetime_good(merged, slo).mean()) if n else float("nan"),
        "tpot_goodput": float(tpot_good(merged, slo=slo).mean()) if n else float("nan"),
        "imbalance": imbalance(rec),
        "prefix_hit_rate": waste.prefix_hit_rate(merged),
        "routing_decisions_per_s": routing_rate(rec),
        "per_replica": per_replica(rec, slo),
    }
