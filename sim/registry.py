"""A tiny name -> factory registry used for every pluggable strategy.

Routing policies, expert-gate policies, latency providers and system backends are all
looked up by the name users write in configs; a wrong name lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from sim.errors import unknown_name

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T] | None = None):
        """Register ``factory`` under ``name`` (upper- or lower-case is kept as given).

        Usable as a decorator: ``@ROUTING_POLICIES.register("LOAD")``.
        """

        def _add(f: Callable[..., T]) -> Callable[..., T]:
            self._factories[name] = f
            return f

        return _add(factory) if factory is not None else _add

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, *args, source: str | None = None, **kwargs) -> T:
        try:
            factory = self._factories[name]
        except KeyError:
            raise unknown_name(self.kind, name, self._factories, source) from None
        return factory(*args, **kwargs)

    def get(self, name: str, source: str | None = None) -> Callable[..., T]:
        """The factory registered under ``name`` (a wrong name lists the valid ones)."""
        try:
            return self._factories[name]
        except KeyError:
            raise unknown_name(self.kind, name, self._factories, source) from None

    def __contains__(self, name: object) -> bool:
        return name in self._factories
