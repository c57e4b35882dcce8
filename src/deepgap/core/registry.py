"""One registry mechanism for models, engines and telemetry backends.

A plug-in is one file that decorates a factory with ``@REGISTRY.register("name")``; lookups of an
unknown name raise a `UsageError` that lists what is known, so the CLI can print it as one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from deepgap.core.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → entry map with a helpful error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``entry`` under ``name`` (names are unique)."""

        def deco(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = entry
            return entry

        return deco

    def add(self, name: str, entry: T) -> None:
        """Register without a decorator."""
        self.register(name)(entry)

    def get(self, name: str) -> T:
        """Return the entry or raise a `UsageError` naming the known entries."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(
                n for n in sorted(self._entries) if not n.startswith("fault:")
            )  # test-only models
            raise UsageError(
                f"unknown {self.kind} {name!r}", f"choose one of: {known} (see `deepgap list {self.kind}s`)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
