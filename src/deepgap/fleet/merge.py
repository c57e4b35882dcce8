"""Combine stores written on separate machines into one (``deepgap merge A B … -o all.sqlite``).

Identity is what the store already uses: a run by its ``run_id`` (time stamp + random part, unique
across machines), a result by ``(run_id, config_key)``. So merging is idempotent — merging the same
stores again, or a store into an output that already holds it, adds nothing — and a result that
exists twice with different contents (e.g. the same run resumed separately on two copies of a
store) is a *conflict*: an error by default, or resolved by keeping the first copy.

Safety: every input must be a deepgap store of this deepgap's schema version (another version is a
clear `StoreError`, nothing is written). The output is built in a temporary file next to it (an
existing output is its starting point) and renamed over it only when complete, so a failed or
interrupted merge leaves the output as it was.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from deepgap.envinfo import REDACT_KEYS, redact, redact_value
from deepgap.errors import StoreDamagedError, StoreError, StoreFullError, UsageError
from deepgap.store.migrations import SCHEMA_VERSION
from deepgap.store import Store, check_path
from deepgap.store.guard import check_hint, column_types, immutable_read, row_problem, uri

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


def _check_input(path: str) -> set[str]:
    """Check that ``path`` is a deepgap store of this schema version; returns its run ids."""
    if not os.path.exists(path):
        raise UsageError(f"store {path} does not exist", "pass the stores to merge")
    if os.path.isdir(path):
        raise StoreError(f"{path} is a directory", "pass store files (.sqlite)")
    s = Store(path, readonly=True)  # not a deepgap store, a newer or a damaged one: StoreError
    try:
        version = int(s.con.execute("PRAGMA user_version").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}, this deepgap merges version {SCHEMA_VERSION} stores",
                "merge stores written by the same deepgap version (upgrade the older machines and re-run)",
            )
        s.results_frame()  # every run and result decodes (StoreDamagedError names the first that does not)
        return {r for (r,) in s.con.execute("SELECT run_id FROM runs")}
    finally:
        s.close()


def _checkpoint(path: str) -> None:
    """Fold an existing output's write-ahead log into it, so that renaming over it loses nothing."""
    con = sqlite3.connect(path, timeout=60)
    try:
        busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        con.close()
    if busy:
        raise StoreError(f"{path} is being written by another process", "merge when its sweep has finished")


def merge(inputs: list[str], output: str, on_conflict: str = "error",
          runs: Sequence[str] | None = None, redact: bool = False) -> MergeReport:
    """Merge the stores ``inputs`` into ``output`` (created, or extended when it exists).

    Args:
        inputs: store paths; an input that is the output itself is skipped.
        output: the merged store.
        on_conflict: ``error`` (default: nothing is written) or ``first`` (keep the copy merged first).
        runs: merge only these run ids (each must be in some input); None: every run.
        redact: replace host names and GPU serials/UUIDs in the whole output with stable hashes.

    Raises:
        StoreError: a foreign or other-version store, or conflicts with ``on_conflict="error"``.
    """
    if not inputs:
        raise UsageError("no stores to merge", "pass at least one store, e.g. deepgap merge a.sqlite -o all.sqlite")
    if on_conflict not in ("error", "first"):
        raise UsageError(f"unknown conflict policy {on_conflict!r}", "use error or first")
    present = set().union(*(_check_input(path) for path in inputs))
    selected = _check_runs(present, runs)
    check_path(output)
    exists = os.path.exists(output) and os.path.getsize(output) > 0
    if exists:
        _check_input(output)
        _checkpoint(output)
    out_abs = os.path.realpath(output)
    sources: list[str] = []
    for path in inputs:
        real = os.path.realpath(path)
        if real != out_abs and real not in sources:
            sources.append(real)
    if not sources and not redact:
        raise UsageError(f"every store to merge is the output {output} itself: nothing to merge",
                         "pass other stores, or another -o path")
    wal = exists and _is_wal(out_abs)
    folder = os.path.dirname(out_abs)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".merging", dir=folder)
    os.close(fd)
    try:
        if exists:  # checkpointed above, so the file alone holds everything: read it without a log
            src = sqlite3.connect(uri(out_abs, True, immutable=True), uri=True)
            dst = sqlite3.connect(tmp)
            src.backup(dst)
            src.close()
            dst.close()
        store = Store(tmp)
        try:
            report = MergeReport(output=output)
            for path in sources:
                try:
                    _merge_one(store.con, path, report, selected)
                except StoreFullError:
                    raise StoreFullError(
                        f"the disk is full (or SQLite's page limit reached) while merging into {output}; "
                        f"{output} is unchanged", "free disk space and merge again") from None
                except StoreError as exc:
                    if exc.problem.startswith(tmp):  # an error met reading the input, not the output
                        raise StoreDamagedError(path + exc.problem[len(tmp):], check_hint(path)) from None
                    raise
            if redact:
                _redact(store.con)
            if report.conflicts and on_conflict == "error":
                shown = "; ".join(report.conflicts[:3]) + (" …" if len(report.conflicts) > 3 else "")
                raise StoreError(
                    f"{len(report.conflicts)} conflict(s): {shown}",
                    "pass --on-conflict first to keep the copy merged first",
                )
            report.runs_total = store.con.execute("SELECT count(*) FROM runs").fetchone()[0]
            report.results_total = store.con.execute("SELECT count(*) FROM results").fetchone()[0]
            # one self-contained file to rename; an existing output keeps its journal mode
            store.con.execute(f"PRAGMA journal_mode = {'WAL' if wal else 'DELETE'}")
        finally:
            store.close()
        os.chmod(tmp, _mode(out_abs if exists else None))  # mkstemp's 0600 is not what a store gets
        os.replace(tmp, out_abs)
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm", f"{tmp}-journal"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return report


def _check_runs(present: set[str], runs: Sequence[str] | None) -> frozenset[str] | None:
    """The selected run ids, after checking that each is among the inputs' runs (``present``)."""
    if runs is None:
        return None
    missing = [r for r in runs if r not in present]
    if missing:
        raise UsageError(f"run {missing[0]} is in none of the stores to merge",
                         "list a store's runs with `deepgap show STORE --runs`, or drop --run")
    return frozenset(runs)


def _merge_one(con: sqlite3.Connection, path: str, report: MergeReport,
               runs: frozenset[str] | None = None) -> None:
    # read-only, and immutable unless a writer has a log open: reading must leave no -wal/-shm beside it
    con.execute("ATTACH DATABASE ? AS src", (uri(path, True, immutable=immutable_read(path)),))
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            before = {r[0] for r in con.execute("SELECT run_id FROM main.runs")}
            foreign = _copy_runs(con, path, report, runs)
            _copy_results(con, path, report, foreign, runs)
            added = {r[0] for r in con.execute("SELECT run_id FROM main.runs")} - before
            _copy_extensions(con, added)
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
            con.execute("ROLLBACK")
            raise
    finally:
        con.execute("DETACH DATABASE src")


def _copy_runs(con: sqlite3.Connection, path: str, report: MergeReport,
               runs: frozenset[str] | None) -> set[str]:
    """Copy new runs; returns the ids of runs that clash with a different run of the same id."""
    foreign: set[str] = set()
    cols = [r[1] for r in con.execute("PRAGMA main.table_info(runs)")]
    types = column_types(con, "runs")
    for row in con.execute("SELECT * FROM src.runs").fetchall():
        new = dict(zip(cols, row, strict=True))
        _check_row(path, "runs", new, types)
        if runs is not None and new["run_id"] not in runs:
            continue
        old = con.execute("SELECT * FROM main.runs WHERE run_id = ?", (new["run_id"],)).fetchone()
        if old is None:
            con.execute(f"INSERT INTO main.runs VALUES ({','.join('?' for _ in cols)})", row)
            report.runs_added += 1
            continue
        old = dict(zip(cols, old, strict=True))
        if any(old[k] != new[k] for k in _RUN_IDENTITY):
            report.conflicts.append(f"run {new['run_id']} differs in {path}")
            foreign.add(new["run_id"])
            continue
        # the same run seen at two moments (e.g. a copy taken mid-sweep): keep the most finished state
        if _RUN_RANK.get(new["status"], 0) > _RUN_RANK.get(old["status"], 0):
            con.execute("UPDATE main.runs SET status = ?, finished_at = ? WHERE run_id = ?",
                        (new["status"], new["finished_at"], new["run_id"]))
    return foreign


def _copy_results(con: sqlite3.Connection, path: str, report: MergeReport, foreign: set[str],
                  runs: frozenset[str] | None) -> None:
    cols = [r[1] for r in con.execute("PRAGMA main.table_info(results)") if r[1] != "result_id"]
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
        mine = con.execute(f"SELECT {sel} FROM main.results WHERE run_id = ? AND config_key = ?",
                           (values[key_run], values[key_cfg])).fetchone()
        if mine is not None:
            if tuple(mine) == tuple(values):
                report.results_present += 1
            else:
                report.conflicts.append(f"run {values[key_run]}: {_label(values[key_cfg])} differs in {path}")
            continue
        new_id = con.execute(f"INSERT INTO main.results ({sel}) VALUES ({marks})", values).lastrowid
        con.execute("INSERT INTO main.samples SELECT ?, repeat, latencies_s FROM src.samples WHERE result_id = ?",
                    (new_id, old_id))
        report.telemetry_added += con.execute(
            "INSERT INTO main.telemetry SELECT run_id, ?, phase, t_s, data_json FROM src.telemetry WHERE result_id = ?",
            (new_id, old_id),
        ).rowcount
        report.results_added += 1


_CORE = {"runs", "results", "samples", "telemetry"}


def _copy_extensions(con: sqlite3.Connection, added_runs: set[str]) -> None:
    """Copy the tables other modules add (roofline_*, serve_*, capacity …) for the runs just merged.

    Generic on purpose, so a new module's table merges without touching this file: a table with a
    ``run_id`` column takes the rows of the newly added runs; its own ``INTEGER PRIMARY KEY`` gets new
    numbers, and a table without ``run_id`` that refers to such a key by name (``profile_id``,
    ``serve_id``) follows its parent's rows with the key mapped; a table with neither (a cache such
    as ``roofline_model_costs``) is merged row by row, keeping what the output has.
    """
    src = {n: sql for n, sql in con.execute(
        "SELECT name, sql FROM src.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
    main = {n for (n,) in con.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}
    for name, sql in src.items():
        if name not in main and name not in _CORE:
            con.execute(sql)
            for (isql,) in con.execute("SELECT sql FROM src.sqlite_master WHERE type = 'index' AND tbl_name = ? "
                                       "AND sql IS NOT NULL", (name,)).fetchall():
                con.execute(isql)
    info = {n: con.execute(f"PRAGMA src.table_info({n})").fetchall() for n in src if n not in _CORE}
    own_key = {n: next((c[1] for c in cols if c[5] == 1 and c[2].upper() == "INTEGER"
                        and sum(x[5] > 0 for x in cols) == 1), None) for n, cols in info.items()}
    maps: dict[str, dict[int, int]] = {}  # key column name → old id → new id
    parents = [n for n, cols in info.items() if "run_id" in [c[1] for c in cols]]
    children = [n for n in info if n not in parents]
    runs = sorted(added_runs)
    parent_keys = {own_key[n] for n in parents if own_key[n]}
    for name in [*parents, *children]:
        cols = [c[1] for c in info[name]]
        key = own_key[name]
        fk = next((c for c in cols if c != key and c in parent_keys), None)
        if name in parents:
            rows = [r for run in runs for r in con.execute(f"SELECT * FROM src.{name} WHERE run_id = ?", (run,))]
        elif fk is not None:
            mapped = maps.get(fk, {})
            rows = [r for r in con.execute(f"SELECT * FROM src.{name}") if r[cols.index(fk)] in mapped]
        else:
            con.execute(f"INSERT OR IGNORE INTO main.{name} SELECT * FROM src.{name}")
            continue
        keep = [c for c in cols if c != key]
        ins = f"INSERT INTO main.{name} ({', '.join(keep)}) VALUES ({', '.join('?' for _ in keep)})"
        for r in rows:
            vals = dict(zip(cols, r, strict=True))
            if fk is not None:
                vals[fk] = maps[fk][vals[fk]]
            new_id = con.execute(ins, [vals[c] for c in keep]).lastrowid
            if key is not None:
                maps.setdefault(key, {})[vals[key]] = new_id


def _check_row(path: str, table: str, row: dict, types: dict) -> None:
    """Refuse to merge a row that does not decode: copying it would spread (or silently alter) the damage."""
    why = row_problem(row, types)
    if why:
        raise StoreDamagedError(
            f"{path} has rows that cannot be decoded ({table}: {why}); nothing was merged", check_hint(path))


def _is_wal(path: str) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(20)
    return len(head) == 20 and head[18] == 2


def _redact(con: sqlite3.Connection) -> None:
    """Host names and GPU serials/UUIDs of every run, result and extension table → stable hashes."""
    con.execute("PRAGMA secure_delete = ON")  # the replaced names must not linger in freed pages
    con.execute("BEGIN IMMEDIATE")
    for run_id, host, env in con.execute("SELECT run_id, host, env_json FROM runs").fetchall():
        con.execute("UPDATE runs SET host = ?, env_json = ? WHERE run_id = ?",
                    (redact_value(host), json.dumps(redact(json.loads(env))), run_id))
    for rid, extra in con.execute("SELECT result_id, extra_json FROM results").fetchall():
        new = json.dumps(redact(json.loads(extra)), default=str)
        if new != extra:
            con.execute("UPDATE results SET extra_json = ? WHERE result_id = ?", (new, rid))
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        if name in ("runs", "results", "samples"):
            continue
        for col in [c for c in column_types(con, name) if c.lower().endswith("_json")]:  # telemetry, serving
            for rowid, text in con.execute(f"SELECT rowid, {col} FROM {name} WHERE {col} IS NOT NULL").fetchall():
                try:
                    new = json.dumps(redact(json.loads(text)), default=str)
                except (TypeError, ValueError):
                    continue
                if new != text:
                    con.execute(f"UPDATE {name} SET {col} = ? WHERE rowid = ?", (new, rowid))
        for col in [c for c in column_types(con, name) if c.lower() in REDACT_KEYS]:
            for (value,) in con.execute(f"SELECT DISTINCT {col} FROM {name}").fetchall():
                con.execute(f"UPDATE {name} SET {col} = ? WHERE {col} = ?", (redact_value(value), value))
    con.execute("COMMIT")


def _mode(existing: str | None) -> int:
    if existing:
        return os.stat(existing).st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _label(key: str) -> str:
    from deepgap.records import ConfigSpec

    try:
        return ConfigSpec.from_key(key).label()
    except (TypeError, ValueError):
        return key
