"""A small name -> factory registry (policies, predictors, cost models)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Builds implementations by name; unknown names and bad options raise ValueError."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T]) -> None:
        if name in self._factories:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def make(self, name: str, **options: object) -> T:
        factory = self._factories.get(name)
        if factory is None:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        try:
            return factory(**options)
        except TypeError as e:
            raise ValueError(f"bad options for {self.kind} {name!r}: {e}") from None
