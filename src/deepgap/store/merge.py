"""The SQL of ``deepgap merge``: copying one store's runs into another, driven by the declared keys.

`deepgap.fleet.merge` decides what to merge and how to treat conflicts; this module moves the rows.
Identity is what the store already uses: a run by its ``run_id``, a result by ``(run_id, config_key)``.
The feature tables are copied by their declarations (`schema.TableSpec`): a table whose parent is
``runs`` takes the rows of the newly merged runs; a row's own INTEGER id gets a new number and the
children that name it (``parent_key``) follow with the id mapped; a table without a parent (a cache
such as ``roofline_model_costs``) is merged row by row on its key, keeping what the output holds.
Tables nobody declared are not merged.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass, field

from deepgap.core.errors import StoreDamagedError, StoreError
from deepgap.store import SCHEMA_VERSION, Store, logcopy
from deepgap.store.guard import (
    check_hint,
    column_types,
    immutable_read,
    row_problem,
    translate,
    uri,
)
from deepgap.store.schema import FEATURE_TABLES, TableSpec
from deepgap.store.scrub import redact_all  # noqa: F401  (re-exported: merge --redact)
from deepgap.store.space import check_space

_RUN_RANK = {"running": 0, "interrupted": 1, "finished": 2}
_RUN_IDENTITY = ("created_at", "command", "spec_json")


@dataclass
class MergeReport:
    """What a merge did; ``conflicts`` names each ``run_id``/configuration that differed."""

    output: str
    runs_added: int = 0
    results_added: int = 0
    results_present: int = 0
    telemetry_added: int = 0
    conflicts: list[str] = field(default_factory=list)
    runs_total: int = 0
    results_total: int = 0


def checkpoint(path: str) -> None:
    """Fold an existing output's write-ahead log into it, so that renaming over it loses nothing.

    Without a log there is nothing to fold, and nothing is opened for writing (which would make a
    ``-wal`` and ``-shm``, and on a full disk fail and leave them). The caller holds the store's
    write lock (`writelock`), so no writer adds to the log meanwhile.
    """
    if not os.path.exists(path + "-wal"):
        return
    check_space(path)
    try:
        con = sqlite3.connect(path, timeout=60)
        try:
            busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise translate(exc, path) from None
    if busy:
        raise StoreError(f"{path} is being written by another process", "merge when its sweep has finished")


def snapshot(path: str, copy: str) -> None:
    """Copy the store at ``path`` (checkpointed: the file alone holds everything) into the file ``copy``."""
    check_space(path)  # the copy goes beside it
    src = sqlite3.connect(uri(path, True, immutable=True), uri=True)
    dst = sqlite3.connect(copy)
    try:
        src.backup(dst)
    except sqlite3.DatabaseError as exc:
        raise translate(exc, path) from None
    finally:
        src.close()
        dst.close()


def current(path: str, folder: str) -> str:
    """``path`` itself when it has this deepgap's schema version, else a migrated copy in ``folder``.

    Merging compares tables column by column, so both sides must have one schema; the input is
    never changed.
    """
    s = Store(path, readonly=True)
    try:
        old = s.file_version < SCHEMA_VERSION
    finally:
        s.close()
    if not old:
        return path
    copy = os.path.join(folder, f"{len(os.listdir(folder))}-{os.path.basename(path)}")
    shutil.copyfile(path, copy)
    if os.path.exists(path + "-wal"):
        shutil.copyfile(path + "-wal", copy + "-wal")
    Store(copy).close()  # a writer migrates in place
    return copy


def is_wal(path: str) -> bool:
    """Whether the store file at ``path`` is in WAL journal mode (from its header)."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    return len(head) == 20 and head[18] == 2


def finish(store: Store, wal: bool, report: MergeReport) -> None:
    """Count the output's runs and results, and set its journal mode (one self-contained file to rename)."""
    report.runs_total = store.con.execute("SELECT count(*) FROM runs").fetchone()[0]
    report.results_total = store.con.execute("SELECT count(*) FROM results").fetchone()[0]
    store.con.execute(f"PRAGMA journal_mode = {'WAL' if wal else 'DELETE'}")


def merge_one(
    store: Store, path: str, report: MergeReport, runs: frozenset[str] | None = None, label: str | None = None
) -> None:
    """Copy the runs of the store at ``path`` (of this schema version) into ``store`` in one transaction.

    ``label`` names the input in conflicts and errors (``path`` may be a migrated copy of it).
    """
    if logcopy.needs_copy(path):  # its log holds rows it cannot read in place: merge a private copy
        with logcopy.folded_copy(path) as copy:
            return merge_one(store, copy, report, runs, label or path)
    con = store.con
    label = label or path
    # read-only, and immutable unless a writer has a log open: reading must leave no -wal/-shm beside it
    con.execute("ATTACH DATABASE ? AS src", (uri(path, True, immutable=immutable_read(path)),))
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            before = {r[0] for r in con.execute("SELECT run_id FROM main.runs")}
            foreign = _copy_runs(con, label, report, runs)
            _copy_results(con, label, report, foreign, runs)
            added = {r[0] for r in con.execute("SELECT run_id FROM main.runs")} - before
            _copy_declared(con, added, label or path)
            only = "" if runs is None else f" AND t.run_id IN ({','.join('?' for _ in runs)})"
            report.telemetry_added += con.execute(
                f"""INSERT INTO main.telemetry SELECT t.run_id, NULL, t.phase, t.t_s, t.data_json
                   FROM src.telemetry t WHERE t.result_id IS NULL{only} AND NOT EXISTS (
                     SELECT 1 FROM main.telemetry m WHERE m.result_id IS NULL AND m.run_id = t.run_id
                     AND m.phase = t.phase AND m.t_s = t.t_s AND m.data_json = t.data_json)""",
                sorted(runs or ()),
            ).rowcount
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # SQLite ends it by itself on some errors (a full disk)
                con.execute("ROLLBACK")
            raise
    finally:
        con.execute("DETACH DATABASE src")


def _copy_runs(
    con: sqlite3.Connection, path: str, report: MergeReport, runs: frozenset[str] | None
) -> set[str]:
    """Copy new runs; returns the ids of runs that clash with a different run of the same id."""
    foreign: set[str] = set()
    types = column_types(con, "runs")
    cols = list(types)
    sel = ", ".join(cols)
    for row in con.execute(f"SELECT {sel} FROM src.runs").fetchall():
        new = dict(zip(cols, row, strict=True))
        _check_row(path, "runs", new, types)
        if runs is not None and new["run_id"] not in runs:
            continue
        old = con.execute(f"SELECT {sel} FROM main.runs WHERE run_id = ?", (new["run_id"],)).fetchone()
        if old is None:
            con.execute(f"INSERT INTO main.runs ({sel}) VALUES ({','.join('?' for _ in cols)})", row)
            report.runs_added += 1
            continue
        old = dict(zip(cols, old, strict=True))
        if any(old[k] != new[k] for k in _RUN_IDENTITY):
            report.conflicts.append(f"run {new['run_id']} differs in {path}")
            foreign.add(new["run_id"])
            continue
        # the same run seen at two moments (e.g. a copy taken mid-sweep): keep the most finished state
        if _RUN_RANK.get(new["status"], 0) > _RUN_RANK.get(old["status"], 0):
            con.execute(
                "UPDATE main.runs SET status = ?, finished_at = ? WHERE run_id = ?",
                (new["status"], new["finished_at"], new["run_id"]),
            )
    return foreign


def _copy_results(
    con: sqlite3.Connection, path: str, report: MergeReport, foreign: set[str], runs: frozenset[str] | None
) -> None:
    cols = [c for c in column_types(con, "results") if c != "result_id"]
    sel = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    key_run, key_cfg = cols.index("run_id"), cols.index("config_key")
    types = column_types(con, "results")
    for row in con.execute(f"SELECT result_id, {sel} FROM src.results ORDER BY result_id").fetchall():
        old_id, values = row[0], row[1:]
        _check_row(path, "results", dict(zip(cols, values, strict=True)), types)
        if values[key_run] in foreign:  # results of a clashing run are never mixed into the other
            continue
        if runs is not None and values[key_run] not in runs:
            continue
        mine = con.execute(
            f"SELECT {sel} FROM main.results WHERE run_id = ? AND config_key = ?",
            (values[key_run], values[key_cfg]),
        ).fetchone()
        if mine is not None:
            if tuple(mine) == tuple(values):
                report.results_present += 1
            else:
                report.conflicts.append(f"run {values[key_run]}: {_label(values[key_cfg])} differs in {path}")
            continue
        new_id = con.execute(f"INSERT INTO main.results ({sel}) VALUES ({marks})", values).lastrowid
        con.execute(
            "INSERT INTO main.samples SELECT ?, repeat, latencies_s FROM src.samples WHERE result_id = ?",
            (new_id, old_id),
        )
        report.telemetry_added += con.execute(
            "INSERT INTO main.telemetry SELECT run_id, ?, phase, t_s, data_json FROM src.telemetry WHERE result_id = ?",
            (new_id, old_id),
        ).rowcount
        report.results_added += 1


def _copy_declared(con: sqlite3.Connection, added_runs: set[str], label: str) -> None:
    """Copy the declared feature tables' rows of the runs just merged (see the module doc).

    A declared column missing from the input (a damaged byte in its stored schema) is damage of the input,
    named as such: SQLite alone would only say "no such column", which reads like a bug of deepgap's.
    """
    maps: dict[str, dict[int, int]] = {}  # table → its old own id → the new one
    for spec in FEATURE_TABLES:  # parents before children
        cols = spec.names
        have = {r[1] for r in con.execute(f'PRAGMA src.table_info("{spec.name}")').fetchall()}
        missing = [c for c in cols if c not in have]
        if missing:
            what = f"lacks column {missing[0]}" if have else "is missing"
            raise StoreDamagedError(
                f"{label} has a damaged schema (table {spec.name} {what}); nothing was merged",
                check_hint(label),
            )
        sel = ", ".join(cols)
        if spec.parent is None:
            con.execute(f"INSERT OR IGNORE INTO main.{spec.name} ({sel}) SELECT {sel} FROM src.{spec.name}")
            continue
        rows = _rows_of_merged(con, spec, sel, added_runs, maps.get(spec.parent, {}))
        own = spec.own_id
        keep = [c for c in cols if c != own]
        ins = f"INSERT INTO main.{spec.name} ({', '.join(keep)}) VALUES ({', '.join('?' for _ in keep)})"
        mapped = maps.setdefault(spec.name, {})
        for r in rows:
            vals = dict(zip(cols, r, strict=True))
            if spec.parent != "runs":
                vals[spec.parent_key] = maps[spec.parent][vals[spec.parent_key]]
            new_id = con.execute(ins, [vals[c] for c in keep]).lastrowid
            if own is not None:
                mapped[vals[own]] = new_id


def _rows_of_merged(
    con: sqlite3.Connection, spec: TableSpec, sel: str, added_runs: set[str], parent_ids: dict[int, int]
) -> list[tuple]:
    """The rows of ``spec`` in the attached input whose parent was merged."""
    key = spec.parent_key
    wanted = sorted(added_runs) if spec.parent == "runs" else sorted(parent_ids)
    out: list[tuple] = []
    for i in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
        chunk = wanted[i : i + 500]
        marks = ",".join("?" for _ in chunk)
        out += con.execute(
            f"SELECT {sel} FROM src.{spec.name} WHERE {key} IN ({marks}) ORDER BY rowid", chunk
        ).fetchall()
    return out


def _check_row(path: str, table: str, row: dict, types: dict) -> None:
    """Refuse to merge a row that does not decode: copying it would spread (or silently alter) the damage."""
    why = row_problem(row, types)
    if why:
        raise StoreDamagedError(
            f"{path} has rows that cannot be decoded ({table}: {why}); nothing was merged", check_hint(path)
        )


def _label(key: str) -> str:
    from deepgap.core.records import ConfigSpec

    try:
        return ConfigSpec.from_key(key).label()
    except (TypeError, ValueError):
        return key
