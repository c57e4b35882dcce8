"""``deepgap check S --recover NEW``: every intact row of a damaged store, saved into a new store.

Recovery never touches the damaged file: its bytes (and its write-ahead log) are copied into a
temporary folder while holding the store's write lock (`writelock`: no writer changes them midway),
and every repair is made on the copy:

1. **header**: a damaged first 100 bytes (magic, page size, fixed fields) is rewritten from what the
   pages say (`repair_header`), so that SQLite opens the file at all;
2. **log**: the copy's write-ahead log is folded into it, so a killed run's last results count;
3. **schema**: a stored ``CREATE`` statement that no longer parses, or a table stored under a
   damaged name, is replaced by the statement deepgap wrote (``PRAGMA writable_schema``);
4. **SQL reads** with ``writable_schema`` on (SQLite then skips a schema entry it cannot use, e.g. an
   index whose root page was cut off, instead of refusing every table), table by table, by
   ``rowid`` ranges that step over damaged pages; a column stored under a damaged name is read by
   its position;
5. **page-level reads** (`deepgap.store.pages`): leaf pages that no b-tree reaches any more
   (truncation, a damaged interior page) give their rows too;
6. SQLite's own ``.recover`` (the ``sqlite3`` tool, where it has one) adds any row still missing.

Only rows that decode, and whose run (and result) survived, go into the new store, which is built
under a temporary name with the damaged one's schema version, migrated, and renamed into place.
Nothing found: nothing is written, and the command says so (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.errors import StoreDamagedError, StoreError, StoreFullError, UsageError
from deepgap.store import logcopy, pages, writelock
from deepgap.store.diagnose import CORE, damaged_names, problem, reference
from deepgap.store.guard import (
    APPLICATION_ID,
    BadText,
    Connection,
    column_types,
    connect,
    decode_text,
    row_problem,
    uri,
)
from deepgap.store.migrations import SCHEMA_VERSION, migrate
from deepgap.store.repair import fold_log, repair_header, repair_schema
from deepgap.store.rowscan import scan
from deepgap.store.space import disk_full, free_bytes


@dataclass
class Recovery:
    """What `recover` saved and lost, per table, and how it read the damaged copy."""

    output: str
    method: str
    saved: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Per table: rows kept and lost."""
        return [
            f"  {t}: {self.saved[t]} kept, {self.lost.get(t, 0)} lost"
            for t in self.saved
            if t in CORE or self.saved[t] or self.lost.get(t)
        ]


@dataclass
class Source:
    """The rows found in the damaged copy: table → rowid → {column: value}, and how they were found."""

    version: int
    rows: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    sql: dict[str, str] = field(default_factory=dict)  # an extension table's CREATE statement
    notes: list[str] = field(default_factory=list)


def check_output(path: str, output: str) -> None:
    """A `UsageError` unless ``output`` may become ``path``'s recovered store: new, and a store path to write.

    ``check --recover`` calls it before it reads the store, so that a bad name is one line, not a report
    and then an error.
    """
    from deepgap.store import check_path

    if os.path.exists(output) and os.path.realpath(output) == os.path.realpath(path):
        raise UsageError(f"--recover {output} is the damaged store itself", "pass a new file name")
    if os.path.exists(output):
        raise UsageError(f"--recover {output} exists", "pass a new file name (recovery never overwrites)")
    check_path(output)


def recover(path: str, output: str) -> Recovery:
    """Write every intact, decodable row of ``path`` into a new store ``output`` (see the module doc)."""
    check_output(path, output)
    # a full disk: one line, and nothing half-written (the work folder goes, the output is never made)
    if disk_full(output):
        raise _full(path, output)
    try:
        return _recover_into(path, output)
    except StoreFullError:
        raise _full(path, output) from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full(path, output) from None
        raise


def _full(path: str, output: str) -> StoreFullError:
    free = (free_bytes(output) or 0) // 1024
    return StoreFullError(
        f"the disk holding {output} is full ({free} KiB free): nothing was recovered or written, and "
        f"{path} is only read",
        f"free disk space (the recovered store needs about {os.path.getsize(path) // 1024 + 1024} KiB), "
        "or pass --recover a path on another disk",
    )


def _recover_into(path: str, output: str) -> Recovery:
    from deepgap.store import Store

    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    with (
        writelock.exclusive(output, "recover into"),
        tempfile.TemporaryDirectory(prefix=".deepgap-recover-", dir=folder) as work,
    ):
        copy = os.path.join(work, "damaged.sqlite")
        with writelock.exclusive(path, "recover", optional=True):  # no writer changes it while copied
            shutil.copyfile(path, copy)
            if os.path.exists(path + "-wal"):
                shutil.copyfile(path + "-wal", copy + "-wal")
        src = read(copy, work)
        found = sum(len(r) for r in src.rows.values())
        if not found:
            raise StoreDamagedError(
                f"nothing in {path} could be recovered: no readable row in any table",
                "nothing was written; a copy of the store taken before the damage is the only way back",
            )
        tmp = os.path.join(work, "recovered.sqlite")
        rec = Recovery(output=output, method=", ".join(src.notes) or "SQLite reads")
        dst = _new_store_at(tmp, src.version)
        try:
            _copy(src, dst, rec)
        finally:
            dst.close()
        if not sum(rec.saved.values()):
            raise StoreDamagedError(
                f"nothing in {path} could be recovered: {found} row(s) found, none usable "
                "(their runs are lost or they do not decode)",
                "nothing was written",
            )
        store = Store(tmp)  # the steps after the source's version, on the recovered rows
        try:
            store.con.execute("PRAGMA journal_mode = DELETE")  # one self-contained file to move
        finally:
            store.close()
        if os.path.exists(output):
            raise UsageError(f"--recover {output} exists", "pass a new file name (recovery never overwrites)")
        shutil.move(tmp, output)
    return rec


def read(copy: str, work: str) -> Source:
    """Every row the techniques of the module doc find in ``copy`` (a copy: it is repaired in place)."""
    notes = []
    if repair_header(copy):
        notes.append("header repaired")
    garbage = logcopy.log_is_garbage(copy)  # SQLite ignores such a log: nothing of it is folded in
    if os.path.exists(copy + "-wal") and fold_log(copy) and not garbage:
        notes.append("its write-ahead log folded in")
    at = _source_version(copy)
    fixed = repair_schema(copy, at)
    if fixed:
        notes.append(f"schema repaired ({', '.join(fixed)})")
    src = Source(version=at)
    _sql_rows(copy, src)
    notes.append("SQLite reads with writable_schema")
    extra = _page_rows(copy, src)
    if extra:
        notes.append(f"{extra} more row(s) read page by page")
    extra = _tool_rows(copy, work, src)
    if extra:
        notes.append(f"{extra} more row(s) from SQLite's .recover")
    src.notes = notes
    return src


def _source_version(copy: str) -> int:
    """The damaged store's schema version, as far as its header can be believed (1 … current)."""
    try:
        con = _open(copy)
        try:
            found = int(con.execute("PRAGMA user_version").fetchone()[0])
        finally:
            con.close()
    except (StoreError, sqlite3.DatabaseError):
        found = SCHEMA_VERSION
    return found if 1 <= found <= SCHEMA_VERSION else SCHEMA_VERSION


def _open(copy: str) -> sqlite3.Connection:
    immutable = not os.path.exists(copy + "-wal")
    con = sqlite3.connect(uri(copy, True, immutable), uri=True, factory=Connection, isolation_level=None)
    con.store_path = copy
    con.text_factory = decode_text
    con.execute("PRAGMA writable_schema = ON")
    return con


def _sql_rows(copy: str, src: Source) -> None:
    """Every table's rows through SQLite, columns under their own names (damaged ones by position)."""
    try:
        con = _open(copy)
        tables = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' AND name != 'lost_and_found'"
        ).fetchall()
    except (StoreError, sqlite3.DatabaseError):
        return
    ref = reference(src.version)
    try:
        for name, sql in tables:
            if isinstance(name, BadText):
                continue
            try:
                stored = list(column_types(con, name))
            except (StoreError, sqlite3.DatabaseError):
                continue
            mapping = damaged_names(stored, [c for c, _ in ref.get(name, [])])
            rows, _ = scan(con, name)
            found = src.rows.setdefault(name, {})
            for r in rows:
                found[r["_rowid_"]] = {mapping.get(k, k): v for k, v in r.items() if k != "_rowid_"}
            if name not in CORE:
                src.sql[name] = sql
    finally:
        con.close()


def _page_rows(copy: str, src: Source) -> int:
    """Rows that only a page-level read finds (`deepgap.store.pages`); returns how many it added."""
    pf = pages.open_file(copy)
    if pf is None:
        return 0
    try:
        con = _open(copy)
        try:
            roots = {
                str(n): int(p)
                for n, p in con.execute(
                    "SELECT name, rootpage FROM sqlite_master WHERE type = 'table' AND rootpage > 0"
                ).fetchall()
            }
        finally:
            con.close()
    except (StoreError, sqlite3.DatabaseError, TypeError, ValueError):
        roots = {}
    ref = reference(src.version)
    columns = {t: [c for c, _ in ref[t]] for t in CORE}
    added = 0
    found = pages.rows_by_table(pf, {"sqlite_master": 1, **roots}, {t: len(c) for t, c in columns.items()})
    for t, by_rowid in found.items():
        if t not in columns:
            continue  # other tables' trees are walked only so that their pages are no orphans
        have = src.rows.setdefault(t, {})
        for rowid, values in by_rowid.items():
            if rowid in have:
                continue
            have[rowid] = _as_row(t, rowid, values, columns[t])
            added += 1
    return added


def _as_row(table: str, rowid: int, values: list[Any], cols: list[str]) -> dict[str, Any]:
    """A page-level record as a row: a missing last column takes its default, the rowid its alias."""
    row = dict(zip(cols, values, strict=False))
    if table == "runs" and "kind" in cols and "kind" not in row:
        row["kind"] = "sweep"  # the default of the column added after the record was written
    if table == "results":
        row["result_id"] = rowid
    return row


def _tool_rows(copy: str, work: str, src: Source) -> int:
    """Rows that only SQLite's ``.recover`` finds (the ``sqlite3`` tool, where it has one)."""
    exe = shutil.which("sqlite3")
    if exe is None:
        return 0
    rebuilt = os.path.join(work, "rebuilt.sqlite")
    try:
        sql = subprocess.run([exe, copy, ".recover"], capture_output=True, timeout=600, check=False)
        if sql.returncode != 0 or not sql.stdout:
            return 0  # no .recover in this build (Debian's): nothing more
        con = sqlite3.connect(rebuilt)
        con.text_factory = decode_text
        try:
            con.executescript(sql.stdout.decode("utf-8", "surrogateescape"))
            added = 0
            for t in CORE:
                have = src.rows.setdefault(t, {})
                with contextlib.suppress(sqlite3.Error):
                    cur = con.execute(f"SELECT rowid AS _rowid_, * FROM {t}")
                    names = [c[0] for c in cur.description]
                    for r in cur.fetchall():
                        d = dict(zip(names, r, strict=True))
                        if d["_rowid_"] not in have:
                            have[d.pop("_rowid_")] = d
                            added += 1
            return added
        finally:
            con.close()
    except (OSError, subprocess.SubprocessError, sqlite3.Error, UnicodeError):
        return 0


def _new_store_at(path: str, at: int) -> sqlite3.Connection:
    """A new store with the schema of version ``at``, so that the source's rows fit it as they are."""
    con = connect(path, readonly=False, check=False)
    con.execute("BEGIN IMMEDIATE")
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    migrate(con, at)
    con.execute("COMMIT")
    return con


def _copy(src: Source, dst: sqlite3.Connection, rec: Recovery) -> None:
    """Copy decodable rows whose parents survived: runs → results → samples, telemetry; then extensions."""
    keep: dict[str, set[Any]] = {"runs": set(), "results": set()}
    for table in CORE:
        rows = [r for _, r in sorted(src.rows.get(table, {}).items())]
        types = column_types(dst, table)
        cols = list(types)
        ins = f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        saved = lost = 0
        dst.execute("BEGIN")
        for r in rows:
            if table == "results":
                _flag_damaged_extra(r, types)
            ok = all(c in r for c in cols) and problem(table, {c: r[c] for c in cols}, types) is None
            if ok and table in ("results", "telemetry"):
                ok = r["run_id"] in keep["runs"]
            if ok and table in ("samples", "telemetry") and r["result_id"] is not None:
                ok = r["result_id"] in keep["results"]
            if ok and dst.execute(ins, [r[c] for c in cols]).rowcount:
                saved += 1
                if table == "runs":
                    keep["runs"].add(r["run_id"])
                elif table == "results":
                    keep["results"].add(r["result_id"])
            else:
                lost += 1
        dst.execute("COMMIT")
        rec.saved[table], rec.lost[table] = saved, lost
    _copy_extensions(src, dst, rec)


def _flag_damaged_extra(row: dict[str, Any], types: dict[str, tuple[str, bool]]) -> None:
    """A result whose only damage is its ``extra_json`` keeps its numbers, flagged as recovered.

    The flag is shown by ``show`` and the report, so a lost correctness or telemetry flag is not
    mistaken for a clean measurement.
    """
    if "extra_json" not in row or row_problem({"extra_json": row["extra_json"]}, types) is None:
        return
    rest = {k: v for k, v in row.items() if k not in ("extra_json", "_rowid_")}
    if row_problem(rest, types) is None:
        row["extra_json"] = json.dumps({"flags": ["recovered: extra data was damaged"]})


def _copy_extensions(src: Source, dst: sqlite3.Connection, rec: Recovery) -> None:
    """Tables other modules add (roofline_*, serve_* …): their schema and every readable row."""
    have = {r[0] for r in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    for name, rows in src.rows.items():
        if name in CORE:
            continue
        if name not in have:  # a table of a schema step after the source's version, or nobody's
            try:
                dst.execute(src.sql[name])
            except (sqlite3.Error, KeyError):
                continue
        cols = list(column_types(dst, name))
        saved = 0
        dst.execute("BEGIN")
        for r in rows.values():
            use = [c for c in cols if c in r]
            if use and not any(isinstance(r[c], BadText) for c in use):
                marks = ", ".join("?" for _ in use)
                ins = f"INSERT OR IGNORE INTO {name} ({', '.join(use)}) VALUES ({marks})"
                with contextlib.suppress(sqlite3.Error):
                    saved += dst.execute(ins, [r[c] for c in use]).rowcount
        dst.execute("COMMIT")
        rec.saved[name], rec.lost[name] = saved, len(rows) - saved
