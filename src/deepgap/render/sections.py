"""The report's sections: each feature registers one, the report builds them in order.

A section is a name, an order and a ``build(ctx) -> Parts`` function, plus the column specs of the tables it
may add. Each feature's section module calls `register` when imported; the report imports them all
(`deepgap.report.sections`), then builds every registered section against one `ReportContext` and merges
their tables, figures and table specs into that build's report. Nothing global
changes during a build: a section's table specs travel in its `Parts`, not through a shared dict.

To add a section: a module with a ``build(ctx)`` that calls `register` at import, and its import in
`deepgap.report.sections`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# A table's title and its columns: (header, column name or row -> text), as `deepgap.render.formatting` renders.
TableSpec = tuple[str, Any]


@dataclass
class ReportContext:
    """What every section of one build reads: the store, the chosen runs, and the results loaded once.

    ``results`` are the prepared per-measurement rows, ``configurations`` their aggregate (one row per
    configuration), ``telemetry`` each chosen run's samples by run id (empty when there are no results).
    ``store``: the read-only `deepgap.store.Store` the build holds open while its sections read (opened
    once per build), or None (a context built by hand): `source` is what a section reads from.
    """

    store_path: str
    run_ids: list[str] | None
    interactive: bool
    runs: list[dict[str, Any]]
    results: pd.DataFrame
    configurations: pd.DataFrame
    telemetry: dict[str, pd.DataFrame] = field(default_factory=dict)
    store: Any = None

    @property
    def source(self) -> Any:
        """The open store when the build holds one, else the store's path (`deepgap.store.reading`)."""
        return self.store if self.store is not None else self.store_path


@dataclass
class Parts:
    """A section's contribution: tables by name, figures in page order, table specs for this build.

    ``table_specs`` override the section's declared ones (e.g. columns known only once the data is read).
    """

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[Any] = field(default_factory=list)
    table_specs: dict[str, TableSpec] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """One section: built in ascending ``order``; ``table_specs`` declares the tables it may add."""

    name: str
    order: int
    build: Callable[[ReportContext], Parts]
    table_specs: dict[str, TableSpec] = field(default_factory=dict)


_SECTIONS: dict[str, Section] = {}


def register(section: Section) -> Section:
    """Add (or replace, by name) a section; called by a section's module when it is imported."""
    _SECTIONS[section.name] = section
    return section


def registered() -> list[Section]:
    """Every registered section, in build order."""
    return sorted(_SECTIONS.values(), key=lambda s: (s.order, s.name))


def table_specs() -> dict[str, TableSpec]:
    """Every table any section may add, with its declared spec, in build order."""
    out: dict[str, TableSpec] = {}
    for s in registered():
        out.update(s.table_specs)
    return out
