"""The embedded SQLite store: WAL mode, versioned schema, one transaction per finished configuration.

Why this shape: a sweep killed at any instant loses at most the configuration in flight, because a
result row and its raw samples are committed together (``BEGIN IMMEDIATE`` … ``COMMIT``); ``--resume``
skips the configuration keys a run already holds. WAL plus a busy timeout lets two runs write one
store at once; a writing `Store` holds the store's write lock shared, so that a merge into the file
or a recovery of it (which take it exclusive) waits for them (`deepgap.store.writelock`). A deepgap
store is recognised by its ``application_id``; its schema version is ``user_version``, brought up to
date when the store is opened (`deepgap.store.migrations`: in place for a writer, in memory for a
reader). Every SQL statement of deepgap lives in this package: the
features' tables are declared here (`deepgap.store.schema`) and read and written through typed helpers
(`deepgap.store.rows`); merging (`deepgap.store.merge`), checking (`deepgap.store.diagnose`) and
recovery (`deepgap.store.recover`, `repair`, `pages`) too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from deepgap.core.envinfo import redact, redact_text, redact_value
from deepgap.core.errors import StoreError, StoreFullError
from deepgap.core.records import KEY_ONLY_FIELDS, Result, Status
from deepgap.store import guard, held, space, writelock
from deepgap.store.frames import ResultReads
from deepgap.store.guard import (
    APPLICATION_ID,
    Connection,
    RowDecoder,
    check_schema,
    connect,
    decode_text,
    expected_columns,
)
from deepgap.store.header import check_header
from deepgap.store.migrations import CORE_V1, SCHEMA_VERSION, migrate, version
from deepgap.store.paths import check_path, check_store_path, check_writable
from deepgap.store.rows import TableAccess
from deepgap.store.schema import RUN_KINDS, TableSpec

__all__ = ["RUN_KINDS", "SCHEMA_VERSION", "Store", "TableSpec", "check_path", "check_writable", "reading"]

_STAT_FIELDS = [
    f.name
    for f in dataclasses.fields(Result)
    if f.name not in ("spec", "latency", "samples_s", "details", "telemetry")
]


RESUMABLE = ("sweep", "fleet")  # the run kinds `deepgap run --resume` continues


class Store(RowDecoder, TableAccess, ResultReads):
    """A deepgap results store at ``path``. ``readonly`` stores never create or change the file.

    ``skip_damaged``: rows that cannot be decoded are left out (and counted in ``skipped``) instead
    of raising a `StoreDamagedError` error that names the first of them. ``redact``: host names and GPU
    serials read from runs and results are replaced by stable hashes (`envinfo.redact`). Both default
    to what the command set in `guard.READ`.
    """

    def __init__(
        self, path: str, readonly: bool = False, skip_damaged: bool | None = None, redact: bool | None = None
    ) -> None:
        self.path = os.fspath(path)
        self.skip_damaged = guard.READ["skip_damaged"] if skip_damaged is None else skip_damaged
        self.redact = guard.READ["redact"] if redact is None else redact
        self.skipped: dict[str, int] = {}
        self._types: dict[str, dict[str, tuple[str, bool]]] = {}
        if not self.path.strip():
            raise StoreError("the store path is empty", "pass a store path, e.g. results.sqlite")
        check_store_path(self.path)  # not UTF-8, too long, a FIFO or device: before anything opens it
        exists = os.path.exists(self.path)
        if readonly and not exists:
            raise StoreError(
                f"store {self.path} does not exist", "run `deepgap run` first, or name an existing store"
            )
        if exists:
            if os.path.isdir(self.path):
                raise StoreError(
                    f"store path {self.path} is a directory", "pass a file path, e.g. results.sqlite"
                )
            check_header(self.path)  # not a store, a newer one, a damaged header
            if readonly and os.path.getsize(self.path) == 0:
                raise StoreError(
                    f"{self.path} is empty (0 bytes), not a deepgap store", "pass another store path"
                )
        if not readonly:
            self._check_writable(exists)
            space.check_space(self.path)  # a full disk: one line, before SQLite makes a -wal/-shm
        self._created = not readonly and (not exists or os.path.getsize(self.path) == 0)
        # appenders share the write lock; a merge or recovery of this file waits for them (writelock.py)
        self._lock = None if readonly else writelock.acquire(self.path, False, "write to")
        logs = {f: os.path.exists(f) for f in (f"{self.path}-wal", f"{self.path}-shm")}
        try:
            self.con = connect(self.path, readonly)
            self._held = held.hold(self.path)  # no raw open/close of the file while open (held.py)
            self.con.row_factory = sqlite3.Row
            self.file_version = version(self.con)  # before migrating (0: a new file)
            if not self._created:
                check_schema(self.con, self.path, expected_columns(CORE_V1))  # every version has these
                if readonly and self.file_version < SCHEMA_VERSION:
                    self._migrate_in_memory()
            if not readonly and not self._created:
                self.runs()  # undecodable runs stop a writer before it changes anything (journal mode too)
            if not readonly:
                self.con.execute("PRAGMA journal_mode = WAL")
                self.con.execute("PRAGMA synchronous = NORMAL")
                self._migrate()
        except BaseException:
            if hasattr(self, "con"):
                self.con.close()
                held.release(getattr(self, "_held", None))
            if not exists and os.path.exists(self.path) and os.path.getsize(self.path) == 0:
                os.remove(self.path)  # nothing half-made is left behind
            if self._lock is not None:
                self._lock.release()
                writelock.remove_new_logs(self.path, [f for f, was in logs.items() if not was])
            raise
        self.con.row_factory = sqlite3.Row

    def _check_writable(self, exists: bool) -> None:
        check_writable(self.path, exists)
        parent = os.path.dirname(os.path.abspath(self.path))
        if not exists:
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create directory {parent} ({exc.strerror})",
                    "pass a store path in a folder you can write to",
                ) from None

    def _migrate(self) -> None:
        """Bring the file to `SCHEMA_VERSION` in one transaction (a new file: every step from 0)."""
        with self.transaction():
            if version(self.con) == 0:
                tables = self.con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if tables:
                    raise StoreError(
                        f"{self.path} is an SQLite file but not a deepgap store", "pass another --store path"
                    )
                self.con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            migrate(self.con)

    def _migrate_in_memory(self) -> None:
        """Read an older store through a migrated copy in memory: reading never changes the file."""
        mem = sqlite3.connect(":memory:", isolation_level=None, factory=Connection)
        mem.store_path = self.path
        mem.text_factory = decode_text
        try:
            self.con.backup(mem)
        except sqlite3.DatabaseError as exc:
            mem.close()
            raise guard.translate(exc, self.path) from None
        self.con.close()
        self.con = mem
        with self.transaction():
            migrate(mem)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (or ``ROLLBACK`` on any exception)."""
        if self.con.in_transaction:
            yield self.con
            return
        self.con.execute("BEGIN IMMEDIATE")
        try:
            yield self.con
        except BaseException:
            if self.con.in_transaction:
                self.con.execute("ROLLBACK")
            raise
        else:
            if self.con.in_transaction:
                self.con.execute("COMMIT")

    def close(self, discard_empty: bool = False) -> None:
        """Close the connection.

        ``discard_empty``: remove the file if this Store created it and no run was ever stored (a run
        that failed before measuring leaves nothing behind).
        """
        empty = False
        if discard_empty and self._created:
            try:
                empty = self.con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
            except StoreError:
                empty = False
        self.con.close()
        held.release(getattr(self, "_held", None))
        self._held = None
        if empty:
            for f in (self.path, f"{self.path}-wal", f"{self.path}-shm", f"{self.path}-journal"):
                if os.path.exists(f):
                    os.remove(f)
        if getattr(self, "_lock", None) is not None:
            self._lock.release()
            self._lock = None

    # --- runs -------------------------------------------------------------------------------
    def begin_run(
        self, spec: dict[str, Any], command: str, env: dict[str, Any], version: str, kind: str = "sweep"
    ) -> str:
        """Create a run row and return its id; ``kind`` names the driver (`schema.RUN_KINDS`)."""
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}; one of {', '.join(RUN_KINDS)}")
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        with self.transaction() as con:
            con.execute(
                "INSERT INTO runs (run_id, created_at, finished_at, status, command, spec_json, env_json, "
                "host, pid, deepgap_version, kind) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    time.time(),
                    None,
                    "running",
                    command,
                    json.dumps(spec),
                    json.dumps(env),
                    socket.gethostname(),
                    os.getpid(),
                    version,
                    kind,
                ),
            )
        return run_id

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        """Mark a run finished (or interrupted).

        A full store cannot mark it interrupted, nor need to: a run left ``running`` is resumed all the
        same, and the error that stopped it is the one to show.
        """
        try:
            with self.transaction() as con:
                con.execute(
                    "UPDATE runs SET status=?, finished_at=? WHERE run_id=?", (status, time.time(), run_id)
                )
        except StoreFullError:
            if status == "finished":
                raise

    def reopen_run(self, run_id: str) -> None:
        """Mark a resumed run as running again, owned by this process."""
        with self.transaction() as con:
            con.execute(
                "UPDATE runs SET status='running', pid=?, host=? WHERE run_id=?",
                (os.getpid(), socket.gethostname(), run_id),
            )

    def runs(self) -> list[dict[str, Any]]:
        """All runs, oldest first, with their spec and environment decoded."""
        rows = self.con.execute("SELECT * FROM runs ORDER BY created_at").fetchall()
        out = []
        for d in self._decoded("runs", rows, "run_id"):
            d["spec"] = json.loads(d.pop("spec_json"))
            d["env"] = json.loads(d.pop("env_json"))
            if self.redact:  # the fingerprint first: the command line is scrubbed of what it names
                d["host"], d["env"] = redact_value(d["host"]), redact(d["env"])
                d["command"] = redact_text(d["command"])
            out.append(d)
        return out

    def run_ids(self) -> set[str]:
        """The ids of every run (undecoded: for checks that must not fail on a damaged row)."""
        return {r[0] for r in self.con.execute("SELECT run_id FROM runs").fetchall()}

    def check_runs(self, run_ids: list[str] | None) -> None:
        """A `StoreError` naming the first of ``run_ids`` that this store does not hold."""
        known = self.run_ids()
        for rid in run_ids or []:
            if rid not in known:
                raise StoreError(
                    f"no run {rid!r} in {self.path}", f"list runs with `deepgap show {self.path} --runs`"
                )

    def run(self, run_id: str) -> dict[str, Any]:
        """One run by id (a `StoreError` if absent)."""
        for r in self.runs():
            if r["run_id"] == run_id:
                return r
        raise StoreError(f"no run {run_id!r} in {self.path}", "list runs with `deepgap show --runs`")

    def latest_unfinished(self, kind: str | tuple[str, ...] | None = RESUMABLE) -> dict[str, Any] | None:
        """The newest run of ``kind`` (one kind, several, None: any) that did not finish, or None.

        The default is what ``deepgap run --resume`` continues: sweeps, on one machine or a fleet. An
        interrupted profile, peaks or serve run is not a sweep to continue.
        """
        kinds = (kind,) if isinstance(kind, str) else kind
        for r in reversed(self.runs()):
            if r["status"] != "finished" and (kinds is None or r["kind"] in kinds):
                return r
        return None

    # --- results ----------------------------------------------------------------------------
    def done_keys(self, run_id: str) -> set[str]:
        """Configuration keys already stored for ``run_id`` (its rows decoded: never resume onto damage)."""
        rows = self.con.execute("SELECT * FROM results WHERE run_id=?", (run_id,)).fetchall()
        return {d["config_key"] for d in self._decoded("results", rows, "result_id")}

    def record(
        self, run_id: str, result: Result, telemetry: list[tuple[str, float, dict[str, Any]]] = ()
    ) -> int | None:
        """Store one finished configuration, its samples and telemetry in one transaction.

        Returns the new ``result_id``, or None when the run already holds this configuration.
        """
        spec = result.spec
        lat = dataclasses.asdict(result.latency) if result.latency else {}
        row: dict[str, Any] = {
            "run_id": run_id,
            "config_key": spec.key,
            **{k: v for k, v in dataclasses.asdict(spec).items() if k not in KEY_ONLY_FIELDS},
            "status": Status(result.status).value,
            "reason": result.reason,
            "n_samples": lat.get("n"),
            **{f"latency_{k}": v for k, v in lat.items() if k != "n"},
            **{k: getattr(result, k) for k in _STAT_FIELDS if k not in ("status", "reason")},
            "extra_json": json.dumps(result.details.to_json(), default=str),
        }
        row["include_transfer"] = int(bool(row["include_transfer"]))
        if row["ci_met"] is not None:
            row["ci_met"] = int(row["ci_met"])
        try:
            return self._insert(run_id, row, result, telemetry)
        except StoreFullError:
            kept = self.con.execute("SELECT count(*) FROM results WHERE run_id=?", (run_id,)).fetchone()[0]
            raise StoreFullError(
                f"{self.path} is full (the disk, or SQLite's page limit) while storing "
                f"{spec.label()}: the {kept} configuration(s) of run {run_id} stored before it are kept",
                f"free disk space, then continue with `deepgap run --resume --store {self.path}`",
            ) from None

    def _insert(
        self,
        run_id: str,
        row: dict[str, Any],
        result: Result,
        telemetry: list[tuple[str, float, dict[str, Any]]],
    ) -> int | None:
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.transaction() as con:
            cur = con.execute(f"INSERT OR IGNORE INTO results ({cols}) VALUES ({marks})", tuple(row.values()))
            if cur.rowcount == 0:
                return None
            rid = cur.lastrowid
            con.executemany(
                "INSERT INTO samples VALUES (?,?,?)",
                [(rid, i, np.asarray(s, dtype="<f8").tobytes()) for i, s in enumerate(result.samples_s)],
            )
            con.executemany(
                "INSERT INTO telemetry VALUES (?,?,?,?,?)",
                [(run_id, rid, phase, t, json.dumps(d)) for phase, t, d in telemetry],
            )
        return rid

    def record_run_telemetry(self, run_id: str, samples: list[tuple[str, float, dict[str, Any]]]) -> None:
        """Store run-level telemetry (idle baseline, thermal warm-up) in one transaction."""
        with self.transaction() as con:
            con.executemany(
                "INSERT INTO telemetry VALUES (?,?,?,?,?)",
                [(run_id, None, phase, t, json.dumps(d)) for phase, t, d in samples],
            )


@contextmanager
def reading(store: str | Store) -> Iterator[Store]:
    """A read-only `Store` of ``store``: the one given, left open, or one opened from a path and closed.

    Why: the report's build holds one store open for every section (it opened the file six times, each
    time checking its header and schema); a feature's reader called alone still takes a path.
    """
    if isinstance(store, Store):
        yield store
        return
    st = Store(store, readonly=True)
    try:
        yield st
    finally:
        st.close()
