"""A store's header, read before anything else: an SQLite file, deepgap's, of a schema this deepgap reads.

Why apart from `deepgap.store.guard` (which opens and validates connections): the header is judged
from the file's bytes (and its write-ahead log), before any connection exists, and tells a foreign
file, a newer deepgap's store and a damaged header apart; `deepgap check` words what SQLite refuses in
it (`header_problem`) and how much of the file is missing (`truncation`).
"""

from __future__ import annotations

import os
import sqlite3

from deepgap.core.errors import StoreDamagedError, StoreError, StoreNewerError
from deepgap.store import held, logcopy
from deepgap.store.guard import (
    _CORE_TABLES,
    APPLICATION_ID,
    SQLITE_MAGIC,
    check_hint,
    has_log,
    translate,
    uri,
)
from deepgap.store.migrations import SCHEMA_VERSION


def check_header(path: str) -> None:
    """Refuse files that are not deepgap stores, or come from a newer deepgap, from the file header.

    Reads the header (user_version at byte 60, application_id at 68) instead of opening a
    connection first. A header whose id or version disagrees with the tables behind it is called
    damaged, not foreign or newer: one flipped byte must not send the user off to upgrade. A file a
    `Store` of this process holds open was checked when it was opened, and is not read again here
    (`store.held` says why).
    """
    if held.is_held(path):
        return
    with open(path, "rb") as fh:
        head = fh.read(100)
    if not head:
        return  # an empty file becomes a new store
    if head[:16] != SQLITE_MAGIC or len(head) < 100:
        raise StoreError(
            f"{path} is not a deepgap store (not an SQLite database)",
            "pass another store path; if it was one, its header is damaged: " + check_hint(path),
        )
    version = int.from_bytes(head[60:64], "big")
    app_id = int.from_bytes(head[68:72], "big")
    if has_log(path) or (app_id == 0 and version == 0):
        # The write-ahead log may hold a newer first page: a new store's first transactions, a migration.
        app_id, version = _header_through_sqlite(path, app_id, version)
    if app_id == APPLICATION_ID and version <= SCHEMA_VERSION:
        return
    tables, writers = _peek(path)
    if app_id != APPLICATION_ID:
        if tables >= _CORE_TABLES:
            raise StoreDamagedError(
                f"{path} has a damaged header (application id {app_id:#x}, "
                "but the tables of a deepgap store)",
                check_hint(path),
            )
        raise StoreError(f"{path} is an SQLite file but not a deepgap store", "pass another store path")
    if _plausibly_newer(version, writers):
        raise StoreNewerError(
            f"{path} has schema version {version}, newer than this deepgap's {SCHEMA_VERSION}",
            "upgrade deepgap (pip install -U deepgap)",
        )
    by = ", ".join(sorted(writers)) or "(none)"
    raise StoreDamagedError(
        f"{path} has a damaged header (it says schema version {version}, but its runs "
        f"were written by deepgap {by})",
        check_hint(path),
    )


def _header_through_sqlite(path: str, app_id: int, version: int) -> tuple[int, int]:
    """The application id and schema version as SQLite reads them, the log included.

    Falls back to the file's own bytes when the log cannot be opened (a read-only folder without
    its ``-shm``) and holds no rows; one with rows is read through a private copy (`store.logcopy`).
    """
    if logcopy.needs_copy(path):
        with logcopy.folded_copy(path) as copy:
            return _header_through_sqlite(copy, app_id, version)
    try:
        con = sqlite3.connect(uri(path, True), uri=True, timeout=10)
        try:
            return (
                con.execute("PRAGMA application_id").fetchone()[0],
                con.execute("PRAGMA user_version").fetchone()[0],
            )
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        if "unable to open" in str(exc).lower():
            return app_id, version
        raise translate(exc, path) from None


def _peek(path: str) -> tuple[set[str], set[str]]:
    """Table names and the deepgap versions that wrote its runs (empty sets where unreadable)."""
    tables: set[str] = set()
    writers: set[str] = set()
    try:
        con = sqlite3.connect(uri(path, True, immutable=not has_log(path)), uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "runs" in tables:
                writers = {str(r[0]) for r in con.execute("SELECT DISTINCT deepgap_version FROM runs")}
        finally:
            con.close()
    except sqlite3.Error:
        pass
    return tables, writers


def _plausibly_newer(version: int, writers: set[str]) -> bool:
    """Whether a header's newer schema version is believable: a newer deepgap wrote runs, or none did."""
    from deepgap.core.version import __version__

    if version - SCHEMA_VERSION > 16:
        return False  # no deepgap jumps that far; a flipped bit in byte 60-63 does
    if not writers:
        return True
    try:
        from packaging.version import InvalidVersion, Version

        try:
            return any(Version(w) > Version(__version__) for w in writers)
        except InvalidVersion:
            return True
    except ImportError:  # pragma: no cover
        return True


def header_problem(path: str) -> str | None:
    """What makes SQLite refuse the file's first 100 bytes, in words (None: SQLite accepts them)."""
    with open(path, "rb") as fh:
        head = fh.read(100)
    fix = "; `--recover` rewrites it from the pages"
    if len(head) < 100:
        return (
            f"the file is only {len(head)} bytes, shorter than SQLite's 100-byte header: "
            "it holds no data at all (an interrupted copy)"
        )
    if head[:16] != SQLITE_MAGIC:
        return "damaged: the file does not start with SQLite's magic bytes, so SQLite refuses it" + fix
    raw = int.from_bytes(head[16:18], "big")
    if raw != 1 and (raw < 512 or raw > 32768 or raw & (raw - 1)):
        return f"damaged: its page size ({raw}) is not one SQLite writes, so SQLite refuses it" + fix
    if head[18] not in (1, 2) or head[19] not in (1, 2) or head[21:24] != b"\x40\x20\x20":
        return "damaged: its format bytes (18-23) are not SQLite's, so SQLite refuses it" + fix
    return None


def truncation(path: str) -> str | None:
    """How much of the file is missing, from its header's page count (None: complete, or unknown)."""
    with open(path, "rb") as fh:
        head = fh.read(100)
    if len(head) < 100 or head[:16] != SQLITE_MAGIC:
        return None
    raw = int.from_bytes(head[16:18], "big")
    page = 65536 if raw == 1 else raw
    if page < 512 or page & (page - 1):
        return None
    size = os.path.getsize(path)
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96] and pages > 0  # SQLite trusts the count only then
    if valid and size < pages * page:
        missing = (pages * page - size) // 1024
        return (
            f"the file ends at page {size // page} of {pages} ({missing} KiB missing): "
            "it was cut short (an interrupted copy, a full disk)"
        )
    if size % page:
        return f"the file ends inside page {size // page + 1}: it was cut short"
    return None
