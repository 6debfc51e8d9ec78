"""Autoscalers by name. An unknown name raises ValueError listing the known ones; an autoscaler
of your own loads from ``package.module:Class`` (``horizon.registry``)."""

from __future__ import annotations

from typing import Any

from horizon.cluster.autoscaler import Autoscaler
from horizon.cluster.autoscalers.conservative import Conservative
from horizon.cluster.autoscalers.predictive import Predictive
from horizon.cluster.autoscalers.reactive import Reactive
from horizon.registry import Registry

BUILTIN = (Reactive, Predictive, Conservative)


def _builtin() -> Registry[Autoscaler]:
    reg: Registry[Autoscaler] = Registry("autoscaler")
    for cls in BUILTIN:
        reg.register(cls.name, cls)
    return reg


AUTOSCALERS = _builtin()  # read-only after import: a table of constructors, no run state


def autoscaler_names() -> list[str]:
    return AUTOSCALERS.names()


def make_autoscaler(name: str, **options: Any) -> Autoscaler:
    """Build the autoscaler registered as ``name`` (or at ``package.module:Class``) with
    ``options`` as its keyword arguments.

    Raises:
        ValueError: unknown name (listing the known ones), a path that does not resolve, an
            unknown or missing option, or an option out of range (naming it).
    """
    return AUTOSCALERS.make(name, **options)
