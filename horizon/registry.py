"""A small name -> factory registry (policies, predictors, cost models, and what later plugs in).

A registry answers three kinds of names:

* a registered name (``"fcfs"``), built in or registered by the caller;
* ``"package.module:Attr"``: the attribute ``Attr`` of an importable module — a researcher's
  own class, from their own code, with no registration (so it also resolves inside a fresh
  worker process of a parallel sweep, which never ran the caller's ``register`` calls);
* ``"package.module.Attr"`` (hydra's ``_target_`` spelling), when no registered name matches.

Nothing is cached: an imported name is looked up each time (Python caches the module).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def import_object(path: str, kind: str = "object") -> object:
    """The object that ``"pkg.mod:Attr"`` or ``"pkg.mod.Attr"`` names.

    Raises:
        ValueError: the path is malformed, its module cannot be imported or lacks the attribute
            (the message names ``kind`` and the path).
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise ValueError(
            f"{kind} {path!r}: expected a registered name or 'package.module:Class'"
        )
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{kind} {path!r}: cannot import {module_name!r} ({e})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{kind} {path!r}: {module_name!r} has no {attr!r}") from None
    return obj


def is_import_path(name: str) -> bool:
    """Whether ``name`` is spelled as an import path rather than a registered name."""
    return ":" in name or "." in name


def takes(factory: Callable[..., object], parameter: str) -> bool:
    """Whether ``factory`` names ``parameter`` in its signature (``**kwargs`` does not count):
    how a factory says it wants something the run provides (a policy's ``predictor``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(parameter)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def requires(factory: Callable[..., object], parameter: str) -> bool:
    """Whether ``factory`` names ``parameter`` with no default: it must be given."""
    if not takes(factory, parameter):
        return False
    return inspect.signature(factory).parameters[parameter].default is inspect.Parameter.empty


class Registry(Generic[T]):
    """Builds implementations by name; unknown names and bad options raise ValueError."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T]) -> None:
        """Add ``factory`` under ``name`` (an identifier-like name: no ``:``).

        Raises:
            ValueError: the name is taken or spelled like an import path.
        """
        if name in self._factories:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if ":" in name:
            raise ValueError(f"{self.kind} name {name!r} must not contain ':'")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def resolve(self, name: str) -> Callable[..., T]:
        """The factory ``name`` stands for (see the module docstring), not yet called.

        Raises:
            ValueError: unknown name (listing the known ones), or an import path that does not
                resolve to something callable.
        """
        factory = self._factories.get(name)
        if factory is not None:
            return factory
        if not isinstance(name, str) or not is_import_path(name):
            raise ValueError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())} "
                "(or 'package.module:Class' for your own)"
            )
        obj = import_object(name, self.kind)
        if not callable(obj):
            raise ValueError(f"{self.kind} {name!r} is not a class or a function")
        return obj  # type: ignore[return-value]

    def make(self, name: str, **options: object) -> T:
        """``resolve(name)(**options)``; a bad option raises ValueError naming the component."""
        factory = self.resolve(name)
        try:
            return factory(**options)
        except TypeError as e:
            raise ValueError(f"bad options for {self.kind} {name!r}: {e}") from None
