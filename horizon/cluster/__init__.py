"""The cluster layer: many replicas behind one router (pure Python, the core's rules).

* ``Router`` (``router.py``): decisions only, ``route(request, views, now) -> replica index``;
  built-in routers in ``routers/``, one file each, by name through ``make_router``.
* ``ReplicaView`` (``view.py``, ``stale_view.py``): what a router reads, live or late.
* ``Replica`` (``replica.py``): a Scheduler and the cluster's bookkeeping of it.
* ``Cluster`` (``cluster.py``): replicas, a router and views; routes every arrival once.
* ``ObservedBackend`` (``observed_backend.py``): tells a replica of each step on any backend.
* ``SessionRelease`` (``sessions.py``): closed-loop multi-turn arrivals.
* ``ClusterRecords`` and metrics (``records.py``, ``metrics.py``, ``disagg_metrics.py``).
* ``Handoffs`` (``handoffs.py``): prefill/decode disaggregation, KV moved between replicas.
* ``Autoscaler`` and ``FleetView`` (``autoscaler.py``): decisions only, built-in ones in
  ``autoscalers/`` by name through ``make_autoscaler``.

The simulator (``simulator.cluster_simulation``) and the engine's driver run the same objects.
"""

from horizon.cluster.autoscaler import Autoscaler, FleetView
from horizon.cluster.autoscalers import AUTOSCALERS, autoscaler_names, make_autoscaler
from horizon.cluster.cluster import Cluster
from horizon.cluster.handoffs import ROLES, Handoffs, Transfer
from horizon.cluster.observed_backend import ObservedBackend
from horizon.cluster.records import ClusterRecords, merge_records
from horizon.cluster.replica import Replica, Snapshot
from horizon.cluster.router import Router, argmin, least_loaded_index
from horizon.cluster.routers import ROUTERS, make_router, router_names
from horizon.cluster.sessions import SessionRelease
from horizon.cluster.stale_view import StaleView
from horizon.cluster.view import LiveView, PromptHashes, ReplicaView

__all__ = [
    "AUTOSCALERS",
    "ROLES",
    "ROUTERS",
    "Autoscaler",
    "Cluster",
    "ClusterRecords",
    "FleetView",
    "Handoffs",
    "LiveView",
    "ObservedBackend",
    "PromptHashes",
    "Replica",
    "ReplicaView",
    "Router",
    "SessionRelease",
    "Snapshot",
    "StaleView",
    "Transfer",
    "argmin",
    "autoscaler_names",
    "least_loaded_index",
    "make_autoscaler",
    "make_router",
    "merge_records",
    "router_names",
]
