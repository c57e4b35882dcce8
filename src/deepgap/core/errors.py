"""Errors that deepgap reports to users as one line and exit code 2.

A `UsageError` is bad input (unknown model, malformed TOML, unwritable path …): it is raised
*before* anything is written, and the CLI prints ``deepgap: error: <problem>; <fix>``.
"""

from __future__ import annotations

import os


class DeepgapError(Exception):
    """Base class of every error deepgap raises on purpose."""


class UsageError(DeepgapError):
    """Bad input; the message names the problem and the fix. The CLI exits with code 2."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


def env_choice(
    name: str, choices: tuple[str, ...], default: str, *, empty_is_unset=False, fix="", quote=True
) -> str:
    """The value of the environment switch ``name``, one of ``choices``; ``default`` when it is unset.

    Why one reader: each switch (a path kept off by default until a GPU has timed it) is checked the same
    way, by the parent before anything runs and by the worker, which inherits it. ``empty_is_unset``: an
    empty value means unset (else it is a bad value like any other); ``fix`` replaces the hint "set it to
    one of …"; ``quote``: the bad value shown as a Python string (``NAME='x'``), else bare (``NAME=x``).
    """
    value = os.environ.get(name)
    if value is None or (empty_is_unset and not value):
        return default
    if value not in choices:
        shown = repr(value) if quote else value
        raise UsageError(f"{name}={shown}", fix or f"set it to one of {', '.join(choices)}")
    return value


class StoreError(UsageError):
    """A store file that cannot be used (not a deepgap store, newer schema, unwritable)."""


class StoreDamagedError(StoreError):
    """A store file that is damaged: not an SQLite database, damaged pages, or rows that cannot be decoded."""


class StoreNewerError(StoreError):
    """A store written by a newer deepgap (a newer schema version): upgrade, nothing is damaged."""


class StoreFullError(StoreError):
    """A store that could not grow (disk full, or SQLite's page limit); what was stored before is kept."""
