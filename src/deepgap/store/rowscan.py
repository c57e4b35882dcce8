"""Reading every row of a damaged table through SQLite, stepping over damaged pages by ``rowid``.

Why a module of its own: `deepgap check` (`store.diagnose`) and ``--recover`` (`store.recover`) both
read a damaged store's tables this way, and the loop must stay bounded whatever the damage (issue 46:
an unbounded one was killed by the kernel's out-of-memory killer at 22 GB in CI).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from deepgap.core.errors import StoreError


def failure_text(exc: BaseException) -> str:
    """What stopped a read, without the store's path (the report names it once)."""
    text = getattr(exc, "problem", str(exc))
    return text.split(" has ", 1)[-1] if " has " in text else text


class _OutOfOrder(Exception):  # noqa: N818 - a damaged b-tree, read like an SQLite error
    """A table's cursor handed back a rowid at or before one it had already given."""


_MAX_ROWID = 2**63 - 1


def scan(con: sqlite3.Connection, table: str) -> tuple[list[dict[str, Any]], str | None]:
    """Every readable row of ``table`` (with its ``_rowid_``), stepping over damaged pages by rowid.

    Bounded whatever the damage (issue 46): a damaged b-tree can hand rows back out of order (a
    child pointer aimed at a page already read gave rowids 1-6, then 0, 0, ...). Stepping back to
    such a row re-read the same pages without end, and the list of rows grew until the kernel's
    out-of-memory killer ended the process. Now a pass only ever moves forward: a rowid at or before
    the last one read ends the pass as an SQLite error does, each rowid is kept once, and so every
    pass either reads a rowid no pass read before or jumps further ahead.
    """
    rows: dict[int, dict[str, Any]] = {}
    start, gap, failure = -(2**63), 1, None
    q = f'SELECT rowid AS _rowid_, * FROM "{table}" WHERE rowid > ? ORDER BY rowid'
    while True:
        try:
            cur = con.execute(q, (start,))
            names = [c[0] for c in cur.description]
            for r in cur:
                if r[0] <= start:
                    raise _OutOfOrder(f"damaged pages (table {table} gives its rows out of order)")
                rows.setdefault(r[0], dict(zip(names, r, strict=True)))
                start, gap = r[0], 1
            return _by_rowid(rows), failure
        except (StoreError, sqlite3.DatabaseError, _OutOfOrder) as exc:
            failure = failure or failure_text(exc)
            if start == -(2**63):
                start = 0
            if gap == 1:  # rows next to the damage may still be reachable one by one
                for row in _probe(con, table, start + 1, min(start + 64, _MAX_ROWID)):
                    rows.setdefault(row["_rowid_"], row)
            start = min(start + gap, _MAX_ROWID)
            gap *= 4
            if gap > 2**40 or start == _MAX_ROWID:
                return _by_rowid(rows), failure


def _by_rowid(rows: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [rows[k] for k in sorted(rows)]


def _probe(con: sqlite3.Connection, table: str, first: int, last: int) -> list[dict[str, Any]]:
    out = []
    for rowid in range(first, last + 1):
        try:
            cur = con.execute(f'SELECT rowid AS _rowid_, * FROM "{table}" WHERE rowid = ?', (rowid,))
            names = [c[0] for c in cur.description]
            out += [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        except (StoreError, sqlite3.DatabaseError):
            continue
    return out
