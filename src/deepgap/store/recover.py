"""``deepgap check``: find what is damaged in a store, and save what is readable into a new one.

Checking reads everything: SQLite's full ``integrity_check``, then every row of every core table is
decoded the way the readers decode it (`guard.row_problem`: UTF-8, column types, JSON). A
table whose pages cannot be read is scanned by ``rowid`` ranges, stepping over the damage.

Recovery never touches the damaged file: it is copied into a temporary folder first. SQLite's own
``.recover`` (the ``sqlite3`` command-line tool, when installed) rebuilds what the b-trees still
reach, including rows on orphaned pages; without the tool the copy is read row by row. Only rows
that decode, and whose run (and result) survived, go into the new store, which is built under a
temporary name and renamed into place when complete. The new store first gets the damaged one's
schema version, so that its rows fit as they are, and is then migrated like any older store.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from deepgap.errors import StoreError, UsageError
from deepgap.records import Status
from deepgap.store.guard import (
    APPLICATION_ID,
    BadText,
    Connection,
    check_header,
    column_types,
    connect,
    decode_text,
    flat,
    row_problem,
    uri,
)
from deepgap.store.migrations import SCHEMA_VERSION, migrate, version

CORE = ("runs", "results", "samples", "telemetry")
_STATUSES = {s.value for s in Status}


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

    @property
    def damaged(self) -> bool:  # noqa: D102
        return bool(self.fatal or self.header != "ok" or self.integrity != ["ok"]
                    or any(t.bad or t.unreadable for t in self.tables.values()))

    def lines(self) -> list[str]:
        """The report as text lines."""
        out = [f"{self.path}: {'DAMAGED' if self.damaged else 'ok'}", f"  header: {self.header}"]
        if self.fatal:
            return [*out, f"  {self.fatal}"]
        more = [f"… {len(self.integrity) - 5} more"] if len(self.integrity) > 5 else []
        shown = self.integrity[:5] + more
        out.append(f"  integrity: {'; '.join(shown)}")
        for name, t in self.tables.items():
            text = f"  {name}: {t.rows} row(s) read"
            if t.bad:
                text += f", {t.bad} cannot be decoded ({'; '.join(t.examples)})"
            if t.unreadable:
                text += f"; some rows cannot be read ({t.unreadable})"
            out.append(text)
        return out


def _open(path: str) -> sqlite3.Connection:
    con = sqlite3.connect(uri(path, True, immutable=True), uri=True, factory=Connection, isolation_level=None)
    con.store_path = path
    con.text_factory = decode_text
    return con


def scan(con: sqlite3.Connection, table: str) -> tuple[list[dict[str, Any]], str | None]:
    """Every readable row of ``table`` (with its ``_rowid_``), stepping over damaged pages by rowid."""
    rows: list[dict[str, Any]] = []
    start, gap, failure = -(2**63), 1, None
    q = f"SELECT rowid AS _rowid_, * FROM {table} WHERE rowid > ? ORDER BY rowid"
    while True:
        try:
            cur = con.execute(q, (start,))
            names = [c[0] for c in cur.description]
            for r in cur:
                rows.append(dict(zip(names, r, strict=True)))
                start, gap = r[0], 1
            return rows, failure
        except (StoreError, sqlite3.DatabaseError) as exc:
            failure = failure or _why(exc)
            if start == -(2**63):
                start = 0
            if gap == 1:  # rows next to the damage may still be reachable one by one
                rows += _probe(con, table, start + 1, start + 64)
            start += gap
            gap *= 4
            if gap > 2**40:
                return rows, failure


def _probe(con: sqlite3.Connection, table: str, first: int, last: int) -> list[dict[str, Any]]:
    out = []
    for rowid in range(first, last + 1):
        try:
            cur = con.execute(f"SELECT rowid AS _rowid_, * FROM {table} WHERE rowid = ?", (rowid,))
            names = [c[0] for c in cur.description]
            out += [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        except (StoreError, sqlite3.DatabaseError):
            continue
    return out


def _why(exc: BaseException) -> str:
    text = getattr(exc, "problem", str(exc))
    return text.split(" has ", 1)[-1] if " has " in text else text


def check(path: str) -> tuple[CheckReport, sqlite3.Connection | None]:
    """Check ``path``; returns the report and an open read-only connection (None if unusable)."""
    rep = CheckReport(path)
    if not os.path.isfile(path):
        raise UsageError(f"store {path} does not exist", "pass the path of a store file")
    try:
        check_header(path)
    except StoreError as exc:
        rep.header = exc.problem
    try:
        con = _open(path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    except (StoreError, sqlite3.DatabaseError) as exc:
        rep.fatal = _why(exc)
        return rep, None
    try:
        rep.integrity = flat(r[0] for r in con.execute("PRAGMA integrity_check(100)").fetchall())
    except (StoreError, sqlite3.DatabaseError) as exc:
        rep.integrity = [_why(exc)]
    for name in CORE:
        if name not in tables:
            rep.tables[name] = TableCheck(unreadable="table missing")
            continue
        rows, failure = scan(con, name)
        rep.tables[name] = t = TableCheck(rows=len(rows), unreadable=failure)
        types = column_types(con, name)
        for r in rows:
            why = _problem(name, r, types)
            if why:
                t.bad += 1
                if len(t.examples) < 3:
                    t.examples.append(f"rowid {r['_rowid_']}: {why}")
    return rep, con


def _problem(table: str, row: dict[str, Any], types: dict[str, tuple[str, bool]]) -> str | None:
    why = row_problem({k: v for k, v in row.items() if k != "_rowid_"}, types)
    if why is None and table == "results" and row.get("status") not in _STATUSES:
        why = f"status {row.get('status')!r} is unknown"
    if why is None and table == "samples" and len(row["latencies_s"]) % 8:
        why = "latencies_s is not a float64 array"
    return why


@dataclass
class Recovery:
    """What `recover` saved, per table, and how it read the damaged copy."""

    output: str
    method: str
    saved: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)


def recover(path: str, output: str) -> Recovery:
    """Write every readable, decodable row of ``path`` into a new store ``output``."""
    from deepgap.store import Store, check_path

    if os.path.exists(output) and os.path.realpath(output) == os.path.realpath(path):
        raise UsageError(f"--recover {output} is the damaged store itself", "pass a new file name")
    if os.path.exists(output):
        raise UsageError(f"--recover {output} exists", "pass a new file name (recovery never overwrites)")
    check_path(output)
    folder = os.path.dirname(os.path.abspath(output))
    with tempfile.TemporaryDirectory(prefix=".deepgap-recover-", dir=folder) as work:
        copy = os.path.join(work, "damaged.sqlite")
        shutil.copyfile(path, copy)
        if os.path.exists(path + "-wal"):
            shutil.copyfile(path + "-wal", copy + "-wal")
        source, method = _sqlite_recover(copy, work)
        tmp = os.path.join(work, "recovered.sqlite")
        rec = Recovery(output=output, method=method)
        dst = _new_store_at(tmp, _source_version(source))
        try:
            _copy(_open(source), dst, rec)
        finally:
            dst.close()
        store = Store(tmp)  # the steps after the source's version, on the recovered rows
        try:
            store.con.execute("PRAGMA journal_mode = DELETE")  # one self-contained file to move
        finally:
            store.close()
        shutil.move(tmp, output)
    return rec


def _source_version(path: str) -> int:
    """The damaged store's schema version, as far as its header can be believed (1 … current)."""
    try:
        con = _open(path)
        try:
            found = version(con)
        finally:
            con.close()
    except (StoreError, sqlite3.DatabaseError):
        found = 1
    return min(max(found, 1), SCHEMA_VERSION)


def _new_store_at(path: str, at: int) -> sqlite3.Connection:
    """A new store with the schema of version ``at``, so that the source's rows fit it as they are."""
    con = connect(path, readonly=False, check=False)
    con.execute("BEGIN IMMEDIATE")
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    migrate(con, at)
    con.execute("COMMIT")
    return con


def _sqlite_recover(copy: str, work: str) -> tuple[str, str]:
    """The copy rebuilt by ``sqlite3 … .recover`` when that tool works here, else the copy itself."""
    exe = shutil.which("sqlite3")
    if exe is None:
        return copy, "row by row (the sqlite3 tool is not installed)"
    rebuilt = os.path.join(work, "rebuilt.sqlite")
    try:
        sql = subprocess.run([exe, copy, ".recover"], capture_output=True, timeout=600, check=False).stdout
        con = sqlite3.connect(rebuilt)
        try:
            con.executescript(sql.decode("utf-8", "surrogateescape"))
        finally:
            con.close()
        probe = sqlite3.connect(rebuilt)
        try:
            names = {r[0] for r in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            probe.close()
        if "runs" in names and "results" in names:
            return rebuilt, "SQLite's .recover"
    except (OSError, subprocess.SubprocessError, sqlite3.Error, UnicodeError):
        pass
    return copy, "row by row (SQLite's .recover did not rebuild the tables)"


def _copy(src: sqlite3.Connection, dst: sqlite3.Connection, rec: Recovery) -> None:
    """Copy decodable rows whose parents survived: runs → results → samples, telemetry; then extensions."""
    keep: dict[str, set[Any]] = {"runs": set(), "results": set()}
    for table in CORE:
        rows, _ = scan(src, table)
        types = column_types(dst, table)
        cols = list(types)
        ins = f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        saved = lost = 0
        dst.execute("BEGIN")
        for r in rows:
            if table == "results":
                _flag_damaged_extra(r, types)
            ok = all(c in r for c in cols) and _problem(table, {c: r[c] for c in cols}, types) is None
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


def _copy_extensions(src: sqlite3.Connection, dst: sqlite3.Connection, rec: Recovery) -> None:
    """Tables other modules add (roofline_*, serve_* …): their schema and every readable row."""
    try:
        found = src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                            "AND name NOT LIKE 'sqlite_%' AND name != 'lost_and_found'").fetchall()
    except (StoreError, sqlite3.DatabaseError):
        return
    have = {r[0] for r in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    for name, sql in found:
        if name in CORE or isinstance(name, BadText):
            continue
        if name not in have:  # a table of a schema step after the source's version, or nobody's
            try:
                dst.execute(sql)
            except sqlite3.Error:
                continue
        rows, _ = scan(src, name)
        cols = [c for c in column_types(dst, name) if c in column_types(src, name)]
        ins = f"INSERT OR IGNORE INTO {name} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        saved = 0
        dst.execute("BEGIN")
        for r in rows:
            if all(c in r for c in cols) and not any(isinstance(r[c], BadText) for c in cols):
                with contextlib.suppress(sqlite3.Error):
                    saved += dst.execute(ins, [r[c] for c in cols]).rowcount
        dst.execute("COMMIT")
        rec.saved[name], rec.lost[name] = saved, len(rows) - saved
