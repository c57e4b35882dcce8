"""Opening stores defensively: header checks, eager validation, one translation of SQLite's errors.

Why: a store is shared between machines and copied around, so it may be truncated, have damaged
pages or a damaged header. SQLite reads lazily, so without care the first *query* fails, far from
the code that knows which file it was, and the user sees a traceback. Here every connection to a
store is validated when it is opened (``PRAGMA quick_check``) and every SQLite error it raises later
becomes a one-line `StoreError` that names the file and says what is wrong (`translate`).

Reading changes nothing on disk: a store is opened for reading with SQLite's read-only URI mode,
and ``immutable=1`` when no write-ahead log exists (nobody has it open for writing, so there is no
log to read, and SQLite then creates no ``-wal``/``-shm`` files), when its folder is read-only, or
when its log holds nothing SQLite would read (`logcopy.log_is_garbage`) and no deepgap writer holds it.
A writer that starts during such a read appends to its own log and changes the main file only at
a checkpoint (after ~4 MB of log), so a short read still sees one consistent state.

Text that is not UTF-8 is decoded with replacement characters into `BadText` instead of failing
the whole query, so one damaged row can be reported (or skipped) by itself (`row_problem`).
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any
from urllib.request import pathname2url

from deepgap.core.errors import StoreDamagedError, StoreError, StoreFullError
from deepgap.store import held, logcopy, writelock
from deepgap.store.space import disk_full, full_error

APPLICATION_ID = 0x44475031  # "DGP1"
SQLITE_MAGIC = b"SQLite format 3\x00"
_CORE_TABLES = {"runs", "results", "samples", "telemetry"}
OPENED: list[str] = []  # store paths opened in this process, for errors raised outside a Store
# How stores are read when a caller does not say: commands set these from --skip-damaged/--redact, so
# that every reader behind a command (report sections included) reads alike. `reset` restores them.
READ = {"skip_damaged": False, "redact": False}
SKIPPED: dict[str, dict[str, int]] = {}  # path → table → rows left out (the most any one reader left out)


def reset() -> None:
    """Forget the stores opened and the reading options (the start of each command)."""
    OPENED.clear()
    SKIPPED.clear()
    READ.update(skip_damaged=False, redact=False)


def add_read_flags(p, redact: bool = True) -> None:
    """``--skip-damaged`` (and ``--redact``) for a command that reads stores."""
    p.add_argument(
        "--skip-damaged",
        action="store_true",
        help="leave out rows that cannot be decoded (with a warning that counts them)",
    )
    if redact:
        p.add_argument(
            "--redact",
            action="store_true",
            help="replace host names and GPU serials/UUIDs with stable hashes (for sharing)",
        )


def use_read_flags(args) -> None:
    """Apply a command's ``--skip-damaged``/``--redact`` to every store it reads."""
    READ.update(
        skip_damaged=bool(getattr(args, "skip_damaged", False)), redact=bool(getattr(args, "redact", False))
    )


def skipped_warning() -> str | None:
    """One line counting the undecodable rows that readers left out, or None."""
    if not SKIPPED:
        return None
    parts = [
        f"{sum(t.values())} of {p} ({', '.join(f'{n} in {k}' for k, n in sorted(t.items()))})"
        for p, t in SKIPPED.items()
    ]
    return (
        f"deepgap: warning: skipped undecodable rows: {'; '.join(parts)}; "
        f"`deepgap check {next(iter(SKIPPED))}` says more"
    )


def check_hint(path: str) -> str:
    """The fix shown with every damaged-store error."""
    return f"`deepgap check {path}` tells more; its --recover NEW.sqlite saves what is readable"


class BadText(str):
    """A text value whose bytes are not valid UTF-8 (kept, with replacement characters)."""


def decode_text(raw: bytes) -> str:
    """SQLite's text factory for stores: UTF-8, or `BadText` where the bytes are not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return BadText(raw.decode("utf-8", "replace"))


def translatable(exc: BaseException) -> bool:
    """SQLite errors that describe the file, not a mistake in deepgap's own SQL."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(
        exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.IntegrityError)
    ):
        return False
    msg = str(exc).lower()
    if "malformed" in msg or "corrupt" in msg:
        return True
    return not any(w in msg for w in ("no such table", "no such column", "syntax error", "already exists"))


def translate(exc: sqlite3.Error, path: str) -> StoreError:
    """One clear `StoreError` for an SQLite error met while using the store at ``path``."""
    msg = str(exc).lower()
    if "not a database" in msg or "encrypted" in msg:
        return StoreDamagedError(
            f"{path} is not a deepgap store: not an SQLite database (damaged header, or another file)",
            check_hint(path),
        )
    if ("full" in msg or "disk i/o error" in msg) and disk_full(path):
        return full_error(path)
    if "malformed" in msg or "corrupt" in msg or "disk i/o error" in msg:
        return StoreDamagedError(f"{path} has damaged pages (SQLite: {exc})", check_hint(path))
    if "decode" in msg or "utf-8" in msg:
        return StoreDamagedError(f"{path} has rows that cannot be decoded (SQLite: {exc})", check_hint(path))
    if "full" in msg:
        return StoreFullError(
            f"{path} is full (SQLite: {exc}); everything stored before is kept",
            "free disk space, then continue with `deepgap run --resume --store PATH`",
        )
    if "locked" in msg or "busy" in msg:
        return StoreError(f"{path} is locked by another process (SQLite: {exc})", "try again when it is done")
    if "readonly" in msg or "read-only" in msg:
        return StoreError(f"{path} cannot be written (SQLite: {exc})", "pass a writable path")
    return StoreError(f"cannot use store {path} (SQLite: {exc})", check_hint(path))


class _Cursor(sqlite3.Cursor):
    """A cursor whose SQLite errors name the store (see `translate`)."""

    def _wrap(self, fn, *args):
        try:
            return fn(*args)
        except sqlite3.DatabaseError as exc:
            if not translatable(exc):
                raise
            raise translate(exc, self.connection.store_path) from None
        except UnicodeDecodeError:  # a column name (from the stored schema) that is not UTF-8
            path = self.connection.store_path
            raise StoreDamagedError(
                f"{path} has a damaged schema (a name is not UTF-8)", check_hint(path)
            ) from None

    def execute(self, *args):  # noqa: D102
        return self._wrap(super().execute, *args)

    def executemany(self, *args):  # noqa: D102
        return self._wrap(super().executemany, *args)

    def fetchone(self):  # noqa: D102
        return self._wrap(super().fetchone)

    def fetchall(self):  # noqa: D102
        return self._wrap(super().fetchall)

    def fetchmany(self, *args):  # noqa: D102
        return self._wrap(super().fetchmany, *args)

    def __next__(self):
        return self._wrap(super().__next__)


class Connection(sqlite3.Connection):
    """A connection to one store; ``store_path`` names it in errors."""

    store_path = ""

    def cursor(self, factory=_Cursor):  # noqa: D102
        return super().cursor(factory)

    def execute(self, *args):  # noqa: D102
        return self.cursor().execute(*args)

    def executemany(self, *args):  # noqa: D102
        return self.cursor().executemany(*args)


def uri(path: str, readonly: bool, immutable: bool = False) -> str:
    """The ``file:`` URI of ``path`` (special characters quoted)."""
    base = "file:" + pathname2url(os.path.abspath(path))
    if not readonly:
        return base + "?mode=rwc"
    return base + ("?mode=ro&immutable=1" if immutable else "?mode=ro")


def immutable_read(path: str) -> bool:
    """Read without a log when there is none (or the folder cannot hold one): see the module doc."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(path + "-wal") or not os.access(folder, os.W_OK):
        return True
    if logcopy.log_has_rows(path) or held.is_held(path) or writelock.holders(path):
        return False
    # an empty log on a full disk, or a garbage one: SQLite would read nothing from it, but opening
    # the store in place makes a -shm beside it (or fails to, on the full disk)
    return logcopy.log_is_garbage(path) or logcopy.in_place_blocked(path) == "full"


def connect(path: str, readonly: bool, timeout: float = 60, check: bool = True) -> Connection:
    """An open connection, validated unless ``check`` is false (a `StoreError` naming ``path``).

    A log with rows that cannot be read in place is read through a private copy (`store.logcopy`),
    never left out.
    """
    if readonly and logcopy.needs_copy(path):
        return _through_copy(path, timeout, check)
    attempts = [immutable_read(path)] if readonly else [False]
    if readonly and not attempts[0] and not logcopy.log_has_rows(path):
        attempts.append(
            True
        )  # an empty log we may not open (e.g. no -shm, a read-only folder): nothing in it
    for i, immutable in enumerate(attempts):
        try:
            con = sqlite3.connect(
                uri(path, readonly, immutable),
                uri=True,
                timeout=timeout,
                isolation_level=None,
                factory=Connection,
            )
        except sqlite3.Error as exc:
            raise translate(exc, path) from None
        con.store_path = path
        con.text_factory = decode_text
        try:
            con.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if check and os.path.getsize(path) > 0:
                validate(con, path)
        except StoreError as exc:
            con.close()
            if i + 1 < len(attempts) and not isinstance(exc, StoreDamagedError):
                continue
            if readonly and logcopy.log_has_rows(path) and not isinstance(exc, StoreDamagedError):
                return _through_copy(path, timeout, check)  # a log with rows we may not open in place
            raise
        OPENED.append(path)
        return con
    raise AssertionError("unreachable")  # pragma: no cover


def _through_copy(path: str, timeout: float, check: bool) -> Connection:
    """``path`` with its log, read through a private copy into memory (`store.logcopy`)."""
    with logcopy.folded_copy(path) as copy:
        try:
            src = connect(copy, readonly=True, timeout=timeout, check=check)
        except StoreError as exc:
            raise type(exc)(exc.problem.replace(copy, path), exc.fix.replace(copy, path)) from None
        OPENED.remove(copy)
        mem = sqlite3.connect(":memory:", isolation_level=None, factory=Connection)
        try:
            src.backup(mem)
        finally:
            src.close()
    mem.store_path = path
    mem.text_factory = decode_text
    OPENED.append(path)
    return mem


def validate(con: sqlite3.Connection, path: str) -> None:
    """``PRAGMA quick_check``: structural damage (truncation, damaged pages) is found at open."""
    problems = flat(r[0] for r in con.execute("PRAGMA quick_check(5)").fetchall())
    if problems != ["ok"]:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise StoreDamagedError(f"{path} has damaged pages ({problems[0]}{more})", check_hint(path))


def flat(messages) -> list[str]:
    """SQLite's check messages as one-line items (it prefixes some with a '*** in database' line)."""
    out = []
    for m in messages:
        out += [line.strip() for line in str(m).splitlines() if line.strip() and not line.startswith("***")]
    return out or ["ok"]


def has_log(path: str) -> bool:
    """Whether ``path`` has a write-ahead log with content (committed transactions may be only there)."""
    return logcopy.log_has_rows(path)


def check_schema(con: sqlite3.Connection, path: str, expected: dict[str, set[str]]) -> None:
    """Every core table with every column it should have.

    A flipped byte in a stored CREATE statement can rename a column and still pass SQLite's checks.
    """
    for table, cols in expected.items():
        have = set(column_types(con, table))
        if not have:
            raise StoreDamagedError(
                f"{path} has a damaged schema (table {table} is missing)", check_hint(path)
            )
        if cols - have:
            raise StoreDamagedError(
                f"{path} has a damaged schema (table {table} lacks column {sorted(cols - have)[0]})",
                check_hint(path),
            )


def column_types(con: sqlite3.Connection, table: str) -> dict[str, tuple[str, bool]]:
    """Column → (declared type, NOT NULL) of ``table``."""
    rows = con.execute(f'PRAGMA table_info("{table}")').fetchall()
    return {r[1]: (str(r[2]).upper(), bool(r[3])) for r in rows}


def row_problem(row: dict[str, Any], types: dict[str, tuple[str, bool]]) -> str | None:
    """Why a row cannot be used (bad UTF-8, a value of the wrong type, JSON that does not decode), or None."""
    for col, value in row.items():
        decl, notnull = types.get(col, ("", False))
        if isinstance(value, BadText):
            return f"{col} is not valid UTF-8"
        if value is None:
            if notnull:
                return f"{col} is empty"
            continue
        if decl in ("REAL", "INTEGER") and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{col} is {type(value).__name__}, not a number"
        if decl == "TEXT" and not isinstance(value, str):
            return f"{col} is {type(value).__name__}, not text"
        if decl == "BLOB" and not isinstance(value, bytes):
            return f"{col} is {type(value).__name__}, not bytes"
        if col.endswith("_json") or col == "config_key":
            try:
                decoded = json.loads(value)
            except ValueError:
                return f"{col} is not valid JSON"
            if not isinstance(decoded, dict):
                return f"{col} is not a JSON object"
    return None


_COLUMNS: dict[str, dict[str, set[str]]] = {}


def expected_columns(schema: str) -> dict[str, set[str]]:
    """Table → columns of the CREATE statements in ``schema`` (built once in memory)."""
    if schema not in _COLUMNS:
        con = sqlite3.connect(":memory:")
        for stmt in schema.split(";"):
            if stmt.strip():
                con.execute(stmt)
        names = [n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        _COLUMNS[schema] = {n: {r[1] for r in con.execute(f"PRAGMA table_info({n})")} for n in names}
        con.close()
    return _COLUMNS[schema]


class RowDecoder:
    """Row-by-row decoding for `deepgap.store.Store`: bad rows raise, or are skipped and counted.

    Expects ``con``, ``path``, ``skip_damaged``, ``skipped`` and ``_types`` on the instance.
    """

    con: sqlite3.Connection
    path: str
    skip_damaged: bool
    skipped: dict[str, int]
    _types: dict[str, dict[str, tuple[str, bool]]]

    def _bad(self, table: str, what: str, why: str) -> None:
        """Count a row that cannot be decoded (``skip_damaged``), or raise a `StoreDamagedError`."""
        if not self.skip_damaged:
            raise StoreDamagedError(
                f"{self.path} has rows that cannot be decoded ({table} {what}: {why})",
                "pass --skip-damaged to leave them out; " + check_hint(self.path),
            )
        # distinct rows: a table read twice (results as forward and as decode rows) counts each row once
        rows = self.__dict__.setdefault("_skipped_rows", {}).setdefault(table, set())
        rows.add(what)
        self.skipped[table] = len(rows)
        seen = SKIPPED.setdefault(self.path, {})
        seen[table] = max(seen.get(table, 0), self.skipped[table])

    def _decoded(self, table: str, rows: list[sqlite3.Row], key: str) -> list[dict[str, Any]]:
        """``rows`` as dicts, without (or raising on) those that `row_problem` rejects."""
        if table not in self._types:
            self._types[table] = column_types(self.con, table)
        out = []
        for r in rows:
            d = dict(r)
            why = row_problem(d, self._types[table])
            if why is None:
                out.append(d)
            else:
                self._bad(table, f"{key} {d.get(key)!r}", why)
        return out
