"""Where the repository's parts are, for tests at any depth under ``tests/``.

Why one module: the tests live in folders that mirror the packages (``tests/store/``, ``tests/measure/quant/``),
so a path built from a test file's own ``__file__`` depends on how deep it sits and breaks when it moves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent  # the shared helpers (clirun, fixtures_store …) and conftest.py
ROOT = TESTS.parent
SRC = ROOT / "src"
BENCHMARKS = ROOT / "benchmarks"
FIXTURES = TESTS / "fixtures"


def imported_benchmark(name: str) -> Iterator[ModuleType]:
    """For a fixture to ``yield from``: ``benchmarks/<name>.py`` imported, with ``benchmarks/`` on ``sys.path`` until
    the fixture ends (the scripts import their siblings: `decode_linear`, `sm90_cases`)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
