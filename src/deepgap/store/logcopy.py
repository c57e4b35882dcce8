"""A store whose write-ahead log holds rows, in a folder this process cannot write: read through a copy.

Why: a run killed on a disk that was then mounted read-only (or a store copied with its ``-wal``
onto read-only media) keeps its newest committed rows only in the log. SQLite cannot read that log
without creating its index (``-shm``) beside it, so readers used to open the main file alone
(``immutable``), silently short: ``export`` gave 4 rows of 5 and ``check`` said ok. Here the file
and its log are copied into a private temporary folder, the log is folded into the copy there, and
the copy is read; the store itself is only read. Where no copy can be made (no room), the reader
is refused with a line that says how to read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator

from deepgap.core.errors import StoreError


def log_has_rows(path: str) -> bool:
    """Whether ``path`` has a write-ahead log with content (committed rows may be only there)."""
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False


def folder_writable(path: str) -> bool:
    """Whether SQLite could create the log's index beside ``path`` (False on a read-only folder or mount)."""
    return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK)


def needs_copy(path: str) -> bool:
    """A log with rows that cannot be read in place (see the module doc)."""
    return log_has_rows(path) and not folder_writable(path)


@contextlib.contextmanager
def folded_copy(path: str) -> Iterator[str]:
    """A private copy of ``path`` with its log folded in (removed on exit), or a `StoreError` saying what to do."""
    tmp = tempfile.mkdtemp(prefix="deepgap-readonly-")
    copy = os.path.join(tmp, "store.sqlite")
    try:
        try:
            shutil.copyfile(path, copy)
            shutil.copyfile(path + "-wal", copy + "-wal")
            con = sqlite3.connect(copy)  # private: SQLite recovers the log and folds it in on close
            try:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                con.close()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"{path}'s write-ahead log holds rows, its folder is read-only, and no private copy could "
                f"be made to read it ({exc})",
                f"copy {path} and {path}-wal together into a writable folder and read the copy",
            ) from None
        yield copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
