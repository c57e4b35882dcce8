"""Combine stores written on separate machines into one (``deepgap merge A B … -o all.sqlite``).

Identity is what the store already uses: a run by its ``run_id`` (time stamp + random part, unique
across machines), a result by ``(run_id, config_key)``. So merging is idempotent — merging the same
stores again, or a store into an output that already holds it, adds nothing — and a result that
exists twice with different contents (e.g. the same run resumed separately on two copies of a
store) is a *conflict*: an error by default, or resolved by keeping the first copy.

Safety: every input must be a deepgap store; an older schema version is merged from a migrated copy
(the input is never changed), a newer one is a clear `StoreError` and nothing is written. The output
is built in a temporary file next to it (an existing output is its starting point) and renamed over
it only when complete, so a failed or interrupted merge leaves the output as it was. The rows are
moved by `deepgap.store.merge`, which copies the features' tables by their declared keys.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

from deepgap.core.errors import StoreDamagedError, StoreError, StoreFullError, UsageError
from deepgap.store import Store, check_path
from deepgap.store.guard import check_hint
from deepgap.store.merge import (
    MergeReport,
    checkpoint,
    current,
    finish,
    is_wal,
    merge_one,
    redact_all,
    snapshot,
)

__all__ = ["MergeReport", "merge"]


def _check_input(path: str) -> set[str]:
    """Check that ``path`` is a deepgap store this deepgap can read; returns its run ids."""
    if not os.path.exists(path):
        raise UsageError(f"store {path} does not exist", "pass the stores to merge")
    if os.path.isdir(path):
        raise StoreError(f"{path} is a directory", "pass store files (.sqlite)")
    s = Store(path, readonly=True)  # not a deepgap store, a newer or a damaged one: StoreError
    try:
        s.results_frame()  # every run and result decodes (StoreDamagedError names the first that does not)
        return s.run_ids()
    finally:
        s.close()


def merge(
    inputs: list[str],
    output: str,
    on_conflict: str = "error",
    runs: Sequence[str] | None = None,
    redact: bool = False,
) -> MergeReport:
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
        raise UsageError(
            "no stores to merge", "pass at least one store, e.g. deepgap merge a.sqlite -o all.sqlite"
        )
    if on_conflict not in ("error", "first"):
        raise UsageError(f"unknown conflict policy {on_conflict!r}", "use error or first")
    present = set().union(*(_check_input(path) for path in inputs))
    selected = _check_runs(present, runs)
    check_path(output)
    exists = os.path.exists(output) and os.path.getsize(output) > 0
    if exists:
        _check_input(output)
        checkpoint(output)
    out_abs = os.path.realpath(output)
    sources: list[str] = []
    for path in inputs:
        real = os.path.realpath(path)
        if real != out_abs and real not in sources:
            sources.append(real)
    if not sources and not redact:
        raise UsageError(
            f"every store to merge is the output {output} itself: nothing to merge",
            "pass other stores, or another -o path",
        )
    wal = exists and is_wal(out_abs)
    folder = os.path.dirname(out_abs)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", suffix=".merging", dir=folder)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(prefix=".deepgap-merge-", dir=folder) as work:
            if exists:  # checkpointed above, so the file alone holds everything: read it without a log
                snapshot(out_abs, tmp)
            store = Store(tmp)  # an older output is migrated here
            try:
                report = MergeReport(output=output)
                for path in sources:
                    _merge_input(store, path, current(path, work), tmp, report, selected)
                if redact:
                    redact_all(store)
                if report.conflicts and on_conflict == "error":
                    shown = "; ".join(report.conflicts[:3]) + (" …" if len(report.conflicts) > 3 else "")
                    raise StoreError(
                        f"{len(report.conflicts)} conflict(s): {shown}",
                        "pass --on-conflict first to keep the copy merged first",
                    )
                finish(store, wal, report)  # an existing output keeps its journal mode
            finally:
                store.close()
        os.chmod(tmp, _mode(out_abs if exists else None))  # mkstemp's 0600 is not what a store gets
        os.replace(tmp, out_abs)
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm", f"{tmp}-journal"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return report


def _merge_input(
    store: Store, path: str, readable: str, tmp: str, report: MergeReport, selected: frozenset[str] | None
) -> None:
    """Merge one input (``readable``: itself or its migrated copy), with errors that name the input."""
    try:
        merge_one(store, readable, report, selected, label=path)
    except StoreFullError:
        raise StoreFullError(
            f"the disk is full (or SQLite's page limit reached) while merging into {report.output}; "
            f"{report.output} is unchanged",
            "free disk space and merge again",
        ) from None
    except StoreError as exc:
        for name in (tmp, readable):
            if exc.problem.startswith(name):  # an error met reading the input, not the output
                raise StoreDamagedError(path + exc.problem[len(name) :], check_hint(path)) from None
        raise


def _check_runs(present: set[str], runs: Sequence[str] | None) -> frozenset[str] | None:
    """The selected run ids, after checking that each is among the inputs' runs (``present``)."""
    if runs is None:
        return None
    missing = [r for r in runs if r not in present]
    if missing:
        raise UsageError(
            f"run {missing[0]} is in none of the stores to merge",
            "list a store's runs with `deepgap show STORE --runs`, or drop --run",
        )
    return frozenset(runs)


def _mode(existing: str | None) -> int:
    if existing:
        return os.stat(existing).st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
