"""The store, ``--run``, ``--model``, ``--engine``, ``--precision`` as the commands that read results declare them.

What a filter keeps stays each command's. Not a command (no ``NAME``): `deepgap.cli` skips it.
"""

from __future__ import annotations

import argparse

from deepgap.api import DEFAULT_STORE


def add_store_argument(p: argparse.ArgumentParser) -> None:
    """The store a command reads, as its optional first argument."""
    p.add_argument("store", nargs="?", default=DEFAULT_STORE, help=f"store file (default {DEFAULT_STORE})")


def add_run_flag(p: argparse.ArgumentParser, default: str = "every run in the store") -> None:
    """``--run RUN_ID``, repeatable: the runs a command reads; ``default`` says which it reads without one."""
    p.add_argument(
        "--run", action="append", metavar="RUN_ID", help=f"only this run (repeatable; default: {default})"
    )


def add_filter_flags(p: argparse.ArgumentParser, *names: str, several: bool = False) -> None:
    """``--NAME`` for each of ``names`` (model, engine, precision), in their order: one name, or ``several``."""
    for name in names:
        p.add_argument(
            f"--{name}", help=f"only these {name}s (comma-separated)" if several else f"only this {name}"
        )
