"""Engines: how a model is turned into something callable (eager, compile, CUDA graphs, ORT, TensorRT …).

A new engine is one file in this package that subclasses `Engine` and decorates itself with
``@ENGINES.register("name")``, plus its line in `catalog.py` (what the parent reads without importing it;
tests/measure/engines/test_engines_units.py checks the two agree); every module here is imported on first use
in a worker.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from deepgap.measure.engines.base import ENGINES, Engine, Prepared

_loaded = False


def load_engines() -> None:
    """Import every engine module once (registration happens at import)."""
    global _loaded
    if _loaded:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True


def get_engine(name: str, options: dict[str, Any] | None = None) -> Engine:
    """The engine registered as ``name``, given the sweep's ``options`` (a `UsageError` for unknown names)."""
    load_engines()
    return ENGINES.get(name)(options)


__all__ = ["ENGINES", "Engine", "Prepared", "get_engine", "load_engines"]
