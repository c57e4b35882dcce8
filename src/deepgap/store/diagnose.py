"""``deepgap check``: what is wrong with a store, read the way SQLite reads it (its log included).

Why this way: a store that a run is writing, or that a killed run left, keeps its newest committed
transactions in its write-ahead log (``-wal``) until a checkpoint; a new store may have *all* its
tables there. Reading the main file alone (``immutable``) called such healthy stores damaged, so
``check`` opens the store as SQLite does and reads everything in one read transaction: one
consistent state, whatever a writer does meanwhile. It says who holds the store's write lock
(`writelock.holders`), and names each kind of damage in words a user can act on:

- the header (not an SQLite file, a damaged first page, ids that disagree with the tables behind);
- truncation (the file ends before the page count its header gives);
- the stored schema (a table or column whose name no deepgap wrote, checked against the schema of
  the store's own version: one changed byte in a column name passes SQLite's checks);
- SQLite's ``integrity_check`` (damaged pages);
- every row of every core table decoded as the readers decode it (`guard.row_problem`), scanning
  by ``rowid`` ranges around damaged pages (`store.rowscan`).
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.errors import StoreError, StoreNewerError, UsageError
from deepgap.core.records import Status
from deepgap.store import held, logcopy, writelock
from deepgap.store.guard import (
    BadText,
    column_types,
    connect,
    flat,
    has_log,
    row_problem,
)
from deepgap.store.header import check_header, header_problem, truncation
from deepgap.store.migrations import SCHEMA_VERSION, migrate, version
from deepgap.store.rowscan import failure_text, scan

CORE = ("runs", "results", "samples", "telemetry")
_STATUSES = {s.value for s in Status}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass
class TableCheck:
    """What reading one table found."""

    rows: int = 0
    bad: int = 0
    examples: list[str] = field(default_factory=list)
    unreadable: str | None = None  # why a scan stopped early (damaged pages)


@dataclass
class CheckReport:
    """Everything `check` found; ``damaged`` is the verdict."""

    path: str
    header: str = "ok"
    integrity: list[str] = field(default_factory=list)
    tables: dict[str, TableCheck] = field(default_factory=dict)
    fatal: str | None = None  # the file cannot be opened as a database at all
    truncated: str | None = None
    schema: list[str] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)  # who writes it now (pid, command)
    log: str | None = None  # what the write-ahead log holds
    creating: bool = False  # a writer is creating it right now: not a store yet, and not damaged
    foreign: bool = False  # another program's SQLite file

    @property
    def damaged(self) -> bool:  # noqa: D102
        if self.creating:
            return False
        return bool(
            self.fatal
            or self.header != "ok"
            or self.truncated
            or self.schema
            or self.integrity != ["ok"]
            or any(t.bad or t.unreadable for t in self.tables.values())
        )

    def lines(self) -> list[str]:
        """The report as text lines."""
        verdict = "NOT A DEEPGAP STORE" if self.foreign else "DAMAGED" if self.damaged else "ok"
        if self.holders:
            verdict += f" (in use by {'; '.join(self.holders)})"
        out = [f"{self.path}: {verdict}"]
        if self.creating:
            return [*out, "  a new store, being created: check again when its first run has started"]
        out.append(f"  header: {self.header}")
        if self.log:
            out.append(f"  log: {self.log}")
        if self.truncated:
            out.append(f"  truncated: {self.truncated}")
        if self.fatal:
            return [*out, f"  {self.fatal}"]
        shown = self.schema[:4] + ([f"… {len(self.schema) - 4} more"] if len(self.schema) > 4 else [])
        out.append(f"  schema: {'; '.join(shown) if shown else 'ok'}")
        more = [f"… {len(self.integrity) - 5} more"] if len(self.integrity) > 5 else []
        out.append(f"  integrity: {'; '.join(self.integrity[:5] + more)}")
        for name, t in self.tables.items():
            text = f"  {name}: {t.rows} row(s) read"
            if t.bad:
                text += f", {t.bad} cannot be decoded ({'; '.join(t.examples)})"
            if t.unreadable:
                text += f"; some rows cannot be read ({t.unreadable})"
            out.append(text)
        return out


def open_read(path: str, writable_schema: bool = False) -> sqlite3.Connection:
    """A read-only connection as readers get it (the log included), unvalidated: `check` looks itself."""
    con = connect(path, readonly=True, timeout=10, check=False)
    if writable_schema:  # SQLite then skips a schema entry it cannot use instead of refusing them all
        con.execute("PRAGMA writable_schema = ON")
    return con


def check(path: str) -> CheckReport:
    """Check the store at ``path`` (see the module doc); the file is only read."""
    rep = CheckReport(path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise UsageError(f"{path} is not a regular file", "pass the path of a store file")
    if not os.path.isfile(path):
        raise UsageError(f"store {path} does not exist", "pass the path of a store file")
    rep.holders = [h.describe() for h in writelock.holders(path)]
    size = os.path.getsize(path)
    if size == 0:  # (SQLite ignores a log beside an empty file)
        rep.creating = bool(rep.holders)
        rep.fatal = "the file is empty (0 bytes): no store was ever written to it"
        return rep
    _check_file(path, rep)
    try:
        con = open_read(path)
    except (StoreError, sqlite3.DatabaseError) as exc:
        rep.fatal = failure_text(exc)
        return rep
    try:
        con.execute("BEGIN")  # one snapshot for the whole check, whatever a writer commits meanwhile
        try:
            stored = _tables(con)
        except (StoreError, sqlite3.DatabaseError) as exc:
            why = failure_text(exc)
            if "not a database" in why or "not an sqlite" in why.lower():
                rep.fatal = (
                    "SQLite reads nothing else until the header is repaired"
                    if rep.header != "ok"
                    else why.replace(f"{path} ", "")
                )
                return rep
            rep.schema.append(f"SQLite cannot read the schema ({why})")
            con.close()
            con = open_read(path, writable_schema=True)
            con.execute("BEGIN")
            stored = _tables(con)
        if rep.holders and not stored & set(CORE):
            rep.creating = True  # its writer has not committed its tables yet
            return rep
        if not stored & set(CORE) and "not a deepgap store" in rep.header:
            rep.foreign = True
            rep.fatal = (
                "an SQLite file without any of deepgap's tables: another program's file, or a store "
                "whose first page is lost (`--recover` still looks for rows page by page)"
            )
            return rep
        rep.schema += schema_problems(con, _version(con))
        try:
            rep.integrity = flat(r[0] for r in con.execute("PRAGMA integrity_check(100)").fetchall())
        except (StoreError, sqlite3.DatabaseError) as exc:
            rep.integrity = [failure_text(exc)]
        for name in CORE:
            if name not in stored:
                rep.tables[name] = TableCheck(unreadable="table missing")
                continue
            rows, failure = scan(con, name)
            rep.tables[name] = t = TableCheck(rows=len(rows), unreadable=failure)
            types = column_types(con, name)
            for r in rows:
                why = problem(name, r, types)
                if why:
                    t.bad += 1
                    if len(t.examples) < 3:
                        t.examples.append(f"rowid {r['_rowid_']}: {why}")
    except (StoreError, sqlite3.DatabaseError) as exc:
        rep.fatal = rep.fatal or failure_text(exc)
    finally:
        con.close()
    return rep


def _check_file(path: str, rep: CheckReport) -> None:
    """What the file's bytes say before SQLite reads it: truncation, a log in flux, the header."""
    raw = not held.is_held(path)  # a raw open/close would drop this process's SQLite locks (held.py)
    # a file with a log is in flux (a checkpoint writes page 1 before the pages that grow the file):
    # SQLite's own reads, the log included, find missing pages then
    rep.truncated = truncation(path) if raw and not has_log(path) and not rep.holders else None
    if has_log(path):
        kib = os.path.getsize(path + "-wal") // 1024
        rep.log = (
            f"{kib} KiB of transactions not yet folded into the file (a run is writing it, or was "
            "stopped): read with it"
        )
    elif logcopy.log_is_garbage(path):
        kib = os.path.getsize(path + "-wal") // 1024
        rep.log = (
            f"{kib} KiB that hold no transaction SQLite can read (damaged, or not a log): ignored, "
            "as SQLite ignores it"
        )
    rep.header = (header_problem(path) if raw else None) or "ok"
    if rep.header == "ok":
        try:
            check_header(path)
        except StoreNewerError:
            raise  # not damage: one line saying "upgrade deepgap", as every other command says it
        except StoreError as exc:
            rep.header = failure_text(exc).replace(f"{path} ", "")


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}


def _version(con: sqlite3.Connection) -> int:
    try:
        found = version(con)
    except (StoreError, sqlite3.DatabaseError):
        return SCHEMA_VERSION
    return found if 1 <= found <= SCHEMA_VERSION else SCHEMA_VERSION


_REFERENCE: dict[int, dict[str, list[tuple[str, str]]]] = {}


def reference(at: int) -> dict[str, list[tuple[str, str]]]:
    """Table → its (column, declared type) list, in order, as a new store of version ``at`` has them."""
    if at not in _REFERENCE:
        con = sqlite3.connect(":memory:", isolation_level=None)
        migrate(con, at)
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        _REFERENCE[at] = {
            n: [(r[1], str(r[2]).upper()) for r in con.execute(f"PRAGMA table_info({n})")] for n in names
        }
        con.close()
    return _REFERENCE[at]


_SQL: dict[int, dict[str, str]] = {}


def reference_sql(at: int) -> dict[str, str]:
    """Table or index → the CREATE statement a new store of schema version ``at`` stores for it."""
    if at not in _SQL:
        con = sqlite3.connect(":memory:", isolation_level=None)
        migrate(con, at)
        rows = con.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        _SQL[at] = {r[0]: r[1] for r in rows}
        con.close()
    return _SQL[at]


def one_off(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ in exactly one character (one changed byte)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1


def damaged_names(stored: list[str], expected: list[str]) -> dict[str, str]:
    """Stored name → the expected name it was (a name no deepgap writes, one character off a missing one)."""
    missing = [e for e in expected if e not in stored]
    out: dict[str, str] = {}
    for s in stored:
        if s in expected:
            continue
        near = [m for m in missing if one_off(str(s), m) and m not in out.values()]
        if near:
            out[s] = near[0]
        elif (isinstance(s, BadText) or not _IDENT.match(str(s))) and len(stored) == len(expected):
            out[s] = expected[stored.index(s)]  # unreadable: the name at its position
    return out


def schema_problems(con: sqlite3.Connection, at: int) -> list[str]:
    """What in the stored schema no deepgap of version ``at`` wrote: damaged table and column names, types.

    The core tables' CREATE statements are compared word for word with the ones a new store of that
    version stores (migrations never change them); the features' tables, whose columns older
    releases may have declared otherwise, only by their names.
    """
    ref = reference(at)
    stored = [str(t) for t in _tables(con) if not str(t).startswith("sqlite_")]
    statements = {
        str(n): q
        for n, q in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    }
    out = []
    renamed = damaged_names(stored, list(ref))
    out += [f"table {t!r} is stored under the damaged name {s!r}" for s, t in renamed.items()]
    for t, cols in ref.items():
        name = next((s for s, e in renamed.items() if e == t), t)
        if name not in stored:
            if t in CORE:
                out.append(f"table {t} is missing")
            continue
        have = column_types(con, name)
        names = [c for c, _ in cols]
        if not have:
            out.append(f"table {t}: its stored CREATE statement is damaged (SQLite cannot use it)")
            continue
        bad = damaged_names(list(have), names)
        out += [f"table {t}: column {e!r} is stored under the damaged name {s!r}" for s, e in bad.items()]
        if t not in CORE:
            continue
        declared = dict(cols)
        out += [
            f"table {t}: column {c} has the damaged type {typ!r} (deepgap wrote {declared[c]})"
            for c, (typ, _) in have.items()
            if c in declared and typ != declared[c]
        ]
        lost = [c for c in names if c not in have and c not in bad.values()]
        out += [f"table {t} lacks column {c}" for c in lost]
        if not bad and not lost and statements.get(name) != reference_sql(at).get(t):
            out.append(f"table {t}: its stored CREATE statement differs from the one deepgap wrote (damaged)")
    return out


def problem(table: str, row: dict[str, Any], types: dict[str, tuple[str, bool]]) -> str | None:
    """Why a row of a core table cannot be used (`guard.row_problem`, plus status and samples), or None."""
    why = row_problem({k: v for k, v in row.items() if k != "_rowid_"}, types)
    if why is None and table == "results" and row.get("status") not in _STATUSES:
        why = f"status {row.get('status')!r} is unknown"
    if why is None and table == "samples":  # (a damaged column name leaves the row without it)
        lat = row.get("latencies_s")
        if not isinstance(lat, bytes) or len(lat) % 8:
            why = "latencies_s is not a float64 array"
    return why
