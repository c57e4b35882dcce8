"""Errors that deepgap reports to users as one line and exit code 2.

A `UsageError` is bad input (unknown model, malformed TOML, unwritable path …): it is raised
*before* anything is written, and the CLI prints ``deepgap: error: <problem>; <fix>``.
"""

from __future__ import annotations


class DeepgapError(Exception):
    """Base class of every error deepgap raises on purpose."""


class UsageError(DeepgapError):
    """Bad input; the message names the problem and the fix. The CLI exits with code 2."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


class StoreError(UsageError):
    """A store file that cannot be used (not a deepgap store, newer schema, unwritable)."""


class StoreDamagedError(StoreError):
    """A store file that is damaged: not an SQLite database, damaged pages, or rows that cannot be decoded."""


class StoreNewerError(StoreError):
    """A store written by a newer deepgap (a newer schema version): upgrade, nothing is damaged."""


class StoreFullError(StoreError):
    """A store that could not grow (disk full, or SQLite's page limit); what was stored before is kept."""
