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


def named(text: str | None) -> list[str]:
    """The names a comma-separated filter flag gives (``--model a,b``), blanks dropped; none when unset."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def keep_named(frame, args: argparse.Namespace, cols: tuple[str, ...]):
    """``frame``'s rows whose ``col`` is among the names ``--col`` gives, for each of ``cols`` that is set.

    Compared in Python: text from argv may hold undecodable bytes (surrogates), which pandas' arrow strings
    cannot take (the full fuzz found a UnicodeEncodeError traceback, issue 46).
    """
    for col in cols:
        names = set(named(getattr(args, col, None)))
        if names and len(frame):
            frame = frame[[str(v) in names for v in frame[col]]]
    return frame
