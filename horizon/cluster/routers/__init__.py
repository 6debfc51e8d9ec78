"""Routers by name. An unknown name raises ValueError listing the known ones; a router of your
own loads from ``package.module:Class`` (``horizon.registry``)."""

from __future__ import annotations

from typing import Any

from horizon.cluster.router import Router
from horizon.cluster.routers.cost_aware import CostAware
from horizon.cluster.routers.horizon_router import HorizonRouter
from horizon.cluster.routers.least_kv import LeastKV
from horizon.cluster.routers.least_loaded import LeastLoaded
from horizon.cluster.routers.prefix_aware import PrefixAware
from horizon.cluster.routers.random_choice import RandomRouter
from horizon.cluster.routers.round_robin import RoundRobin
from horizon.cluster.routers.sticky import Sticky
from horizon.cluster.routers.weighted import Weighted
from horizon.registry import Registry

BUILTIN = (
    RoundRobin,
    RandomRouter,
    LeastLoaded,
    LeastKV,
    PrefixAware,
    Weighted,
    CostAware,
    Sticky,
    HorizonRouter,
)


def _builtin() -> Registry[Router]:
    reg: Registry[Router] = Registry("router")
    for cls in BUILTIN:
        reg.register(cls.name, cls)
    return reg


ROUTERS = _builtin()  # read-only after import: a table of constructors, no run state


def router_names() -> list[str]:
    return ROUTERS.names()


def make_router(name: str, **kwargs: Any) -> Router:
    """Build the router registered as ``name`` (or at ``package.module:Class``)."""
    return ROUTERS.make(name, **kwargs)
