"""``--model``, ``--engine``, ``--precision`` as the commands that read results declare them: one wording each.

What a filter keeps stays each command's. Not a command (no ``NAME``): `deepgap.cli` skips it.
"""

from __future__ import annotations

import argparse


def add_filter_flags(p: argparse.ArgumentParser, *names: str, several: bool = False) -> None:
    """``--NAME`` for each of ``names`` (model, engine, precision), in their order: one name, or ``several``."""
    for name in names:
        p.add_argument(
            f"--{name}", help=f"only these {name}s (comma-separated)" if several else f"only this {name}"
        )
