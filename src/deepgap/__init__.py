"""deepgap: the inference benchmark behind the DEEP-GAP study, as a tool.

``deepgap.run(spec) -> Results`` measures a sweep into an SQLite store; ``Results.to_pandas()``
returns it as a DataFrame. The ``deepgap`` command wraps the same calls.

The public names are loaded on first use: every module of the package imports this one first (for
``__version__``, or as its parent), and importing the run machinery here would make each of them depend
on all of it, in a cycle through ``deepgap.api``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from deepgap.core.version import __version__

_PUBLIC = {
    "Results": "deepgap.api",
    "run": "deepgap.api",
    "profile": "deepgap.api",
    "peaks": "deepgap.api",
    "SweepSpec": "deepgap.drive.config",
    "ConfigSpec": "deepgap.core.records",
    "Result": "deepgap.core.records",
    "Status": "deepgap.core.records",
}

if TYPE_CHECKING:
    from deepgap.api import Results, peaks, profile, run
    from deepgap.core.records import ConfigSpec, Result, Status
    from deepgap.drive.config import SweepSpec


def __getattr__(name: str) -> Any:
    """``deepgap.run`` and the other public names, imported from their modules when first asked for."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'deepgap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = ["ConfigSpec", "Result", "Results", "Status", "SweepSpec", "__version__", "peaks", "profile", "run"]
