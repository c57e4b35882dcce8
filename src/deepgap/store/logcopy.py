"""A store whose write-ahead log holds rows, in a folder this process cannot write: read through a copy.

Why: a run killed on a disk that was then mounted read-only (or a store copied with its ``-wal``
onto read-only media) keeps its newest committed rows only in the log. SQLite cannot read that log
without creating its index (``-shm``) beside it, so readers used to open the main file alone
(``immutable``), silently short: ``export`` gave 4 rows of 5 and ``check`` said ok. On a full disk
the index cannot be made either: readers failed ("the disk is full", ``check`` said damaged) and
left an empty ``-shm`` beside the store (issue 46). Here the file
and its log are copied into a private temporary folder, the log is folded into the copy there, and
the copy is read; the store itself is only read. Where no copy can be made (no room), the reader
is refused with a line that says how to read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import struct
import tempfile
from collections.abc import Iterator

from deepgap.core.errors import StoreError
from deepgap.store.space import disk_full


def log_has_rows(path: str) -> bool:
    """Whether ``path`` has a write-ahead log with content (committed rows may be only there).

    A log that holds no transaction SQLite would read (`log_is_garbage`) has none.
    """
    try:
        if os.path.getsize(path + "-wal") == 0:
            return False
    except OSError:
        return False
    return not log_is_garbage(path)


_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums over little- / big-endian words


def log_is_garbage(path: str) -> bool:
    """Whether ``path``'s non-empty log holds no committed transaction that SQLite would read.

    Why: SQLite reads a log only up to its last valid commit frame (a header and frames whose
    checksums and salts agree: sqlite.org/fileformat2.html#walformat). A log of random bytes, or one
    whose first frame is damaged, holds none, and SQLite ignores it; but opening the store in place
    still creates the log's index (``-shm``) beside it, which ``check`` and ``--recover`` left there
    (issue 46). Only the frames up to the first commit are read (a page each, at most).
    """
    try:
        with open(path + "-wal", "rb") as fh:
            head = fh.read(32)
            if not head:
                return False
            magic, fmt, page = struct.unpack(">III", head[:12])
            if len(head) < 32 or magic not in _WAL_MAGIC or fmt != 3007000 or page & (page - 1) or page < 512:
                return True
            big = magic & 1
            sums = _checksum(head[:24], big, (0, 0))
            if sums != struct.unpack(">II", head[24:32]):
                return True
            salt = head[16:24]
            while True:
                frame = fh.read(24 + page)
                if len(frame) < 24 + page or frame[8:16] != salt:
                    return True
                sums = _checksum(frame[24:], big, _checksum(frame[:8], big, sums))
                if sums != struct.unpack(">II", frame[16:24]):
                    return True
                if int.from_bytes(frame[4:8], "big"):  # a commit frame: the database size after it
                    return False
    except OSError:
        return False  # unreadable: not known to be garbage (the readers then say what they meet)


def _checksum(data: bytes, big: bool, sums: tuple[int, int]) -> tuple[int, int]:
    """SQLite's log checksum of ``data`` (a multiple of 8 bytes), continued from ``sums``."""
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    s0, s1 = sums
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def folder_writable(path: str) -> bool:
    """Whether SQLite could create the log's index beside ``path`` (False on a read-only folder or mount)."""
    return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK)


def in_place_blocked(path: str) -> str | None:
    """Why SQLite could not make the log's index beside ``path`` ("read-only", "full"), or None."""
    if not folder_writable(path):
        return "read-only"
    if disk_full(path) and not os.path.exists(path + "-shm"):
        return "full"
    return None


def needs_copy(path: str) -> bool:
    """A log with rows that cannot be read in place (see the module doc)."""
    return log_has_rows(path) and in_place_blocked(path) is not None


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
            where = "its disk is full" if in_place_blocked(path) == "full" else "its folder is read-only"
            raise StoreError(
                f"{path}'s write-ahead log holds rows, {where}, and no private copy could be made to "
                f"read it ({exc})",
                f"copy {path} and {path}-wal together into a folder on a disk with room and read the copy",
            ) from None
        yield copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
