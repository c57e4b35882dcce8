"""Where the repository's parts are, for tests at any depth under ``tests/``.

Why one module: the tests live in folders that mirror the packages (``tests/store/``, ``tests/measure/quant/``),
so a path built from a test file's own ``__file__`` depends on how deep it sits and breaks when it moves.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # the shared helpers (clirun, fixtures_store …) and conftest.py
ROOT = TESTS.parent
SRC = ROOT / "src"
BENCHMARKS = ROOT / "benchmarks"
FIXTURES = TESTS / "fixtures"
