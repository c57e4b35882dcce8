"""Repairs made on a *copy* of a damaged store so that SQLite can read it at all (``--recover``).

Why apart from reading: each repair rewrites bytes, and only `deepgap.store.recover`'s private copy
may be rewritten. The header is rebuilt from what the pages say; the log is folded in as a writer's
checkpoint would; schema entries that no longer parse, or whose names a changed byte spoiled, get
the statements deepgap wrote back (``PRAGMA writable_schema``), their root pages kept.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from typing import Any

from deepgap.store.diagnose import CORE, damaged_names, reference, reference_sql
from deepgap.store.guard import SQLITE_MAGIC, BadText, decode_text


def repair_header(copy: str) -> bool:
    """Rewrite a damaged file header from what the pages say; whether anything changed.

    The page size is the one whose first page parses as the schema's b-tree page (the log's header
    names it too); the other fields are SQLite's fixed values.
    """
    with open(copy, "r+b") as fh:
        head = bytearray(fh.read(100))
        if len(head) < 100:
            return False
        size = os.fstat(fh.fileno()).st_size
        new = bytearray(head)
        new[:16] = SQLITE_MAGIC
        raw = int.from_bytes(head[16:18], "big")
        page = 65536 if raw == 1 else raw
        if not _page_fits(head, page, size, fh):
            page = next(
                (
                    p
                    for p in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)
                    if _page_fits(head, p, size, fh)
                ),
                page,
            )
        new[16:18] = (1 if page == 65536 else page).to_bytes(2, "big")
        if new[18] not in (1, 2) or new[19] not in (1, 2):
            new[18] = new[19] = 2 if os.path.exists(copy + "-wal") else 1
        if new[20] >= 32:
            new[20] = 0
        new[21:24] = b"\x40\x20\x20"
        if int.from_bytes(new[44:48], "big") not in (0, 1, 2, 3, 4):  # 0: no table yet
            new[44:48] = (4).to_bytes(4, "big")
        if int.from_bytes(new[56:60], "big") not in (0, 1, 2, 3):
            new[56:60] = (1).to_bytes(4, "big")
        if new == head:
            return False
        new[24:28] = (int.from_bytes(new[24:28], "big") + 1).to_bytes(4, "big")
        new[92:96] = b"\0\0\0\0"  # the page count is then taken from the file's size
        fh.seek(0)
        fh.write(new)
    return True


def _page_fits(head: bytes, page: int, size: int, fh) -> bool:
    """Whether page 1, read with this page size, is a b-tree page whose cells lie inside it."""
    if page < 512 or page > 65536 or page & (page - 1) or size < page:
        return False
    fh.seek(0)
    first = fh.read(page)
    kind = first[100]
    if kind not in (0x05, 0x0D):
        return False
    count = int.from_bytes(first[103:105], "big")
    top = 100 + (12 if kind == 0x05 else 8)
    offs = [int.from_bytes(first[top + 2 * k : top + 2 * k + 2], "big") for k in range(count)]
    return top + 2 * count <= page and all(top + 2 * count <= o < page for o in offs)


def fold_log(copy: str) -> bool:
    """Checkpoint the copy's log into it (what a writer would have done); whether that worked."""
    try:
        con = sqlite3.connect(copy, isolation_level=None)
        try:
            con.execute("PRAGMA writable_schema = ON")
            busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return not busy


def _parses(sql: Any) -> bool:
    if not isinstance(sql, str) or isinstance(sql, BadText):
        return False
    con = sqlite3.connect(":memory:")
    try:
        con.execute(sql.replace("IF NOT EXISTS", ""))
        return True
    except sqlite3.Error:
        return not sql.lstrip().upper().startswith("CREATE TABLE")  # an index on a missing table
    finally:
        con.close()


def repair_schema(copy: str, at: int) -> list[str]:
    """Give each table entry of the copy's schema a name and a statement that SQLite can use.

    A table stored under a damaged name gets its own name back; a ``CREATE`` statement that no
    longer parses is replaced by the one deepgap wrote for that table (its root page kept); an index
    whose statement does not parse is dropped from the schema (reading needs no index).
    """
    ref = reference_sql(at)
    fixed: list[str] = []
    try:
        con = sqlite3.connect(copy, isolation_level=None)
        con.text_factory = decode_text
    except sqlite3.Error:
        return fixed
    try:
        con.execute("PRAGMA writable_schema = ON")
        entries = con.execute("SELECT rowid, type, name, sql FROM sqlite_master").fetchall()
        names = [str(e[2]) for e in entries if e[1] == "table"]
        renamed = damaged_names(names, [n for n in reference(at)])
        con.execute("BEGIN")
        for rowid, kind, name, sql in entries:
            new_name = renamed.get(str(name), str(name))
            core_damaged = new_name in CORE and sql != ref.get(new_name)  # deepgap wrote exactly these
            if kind == "table" and (new_name != name or core_damaged or not _parses(sql)) and new_name in ref:
                con.execute(
                    "UPDATE sqlite_master SET name = ?, tbl_name = ?, sql = ? WHERE rowid = ?",
                    (new_name, new_name, ref[new_name], rowid),
                )
                fixed.append(f"table {new_name}")
            elif kind == "index" and sql is not None and not _parses(sql):
                con.execute("DELETE FROM sqlite_master WHERE rowid = ?", (rowid,))
                fixed.append(f"index {name} dropped")
        if fixed:
            cookie = con.execute("PRAGMA schema_version").fetchone()[0]
            con.execute(f"PRAGMA schema_version = {cookie + 1}")
        con.execute("COMMIT")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            con.execute("ROLLBACK")
        return []
    finally:
        con.close()
    return fixed
