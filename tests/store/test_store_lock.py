"""One writer at a time: runs append together, a merge into (or recovery of) a store waits for them.

And a full disk is a full disk: ``run`` and ``merge`` say so in one line, never call the healthy
store damaged, and leave no ``-wal``/``-shm`` beside it. The disk is faked (``os.statvfs``, and an
SQLite I/O error injected at the write), as the real one would take a mounted file system.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import subprocess
import sys

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store
from test_damaged_stores import FakeRunner  # the damaged-store tests' runner double

from deepgap.store import Store, guard, writelock


@pytest.fixture(autouse=True)
def short_wait(monkeypatch):
    monkeypatch.setattr(writelock, "WAIT_S", 0.2)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[bytes, bytes]:
    """The bytes of S (the store a run writes: one GPU run) and X (another machine's: one CPU run)."""
    out = []
    for name, kw in (("s", {"cpu": False}), ("x", {"gpu": False})):
        path = str(tmp_path_factory.mktemp("built") / f"{name}.sqlite")
        build_store(path, **kw)  # closed: its log folded in and removed
        with open(path, "rb") as fh:
            out.append(fh.read())
    return out[0], out[1]


@pytest.fixture
def stores(tmp_path, built) -> tuple[str, str]:
    """S and X in tmp_path."""
    s, x = tmp_path / "s.sqlite", tmp_path / "x.sqlite"
    s.write_bytes(built[0])
    x.write_bytes(built[1])
    return str(s), str(x)


def _files(folder) -> dict[str, bytes]:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def _runs(path: str) -> list[tuple[str, str]]:
    con = sqlite3.connect(f"file:{path}?immutable=1", uri=True)  # no writer is left: read the file alone
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return con.execute("SELECT run_id, host FROM runs ORDER BY created_at").fetchall()
    finally:
        con.close()


def test_merge_into_a_store_a_run_is_writing_waits_then_refuses_and_loses_nothing(tmp_path, stores):
    s, x = stores
    run = Store(s)  # what `deepgap run --store S` holds for its whole sweep
    try:
        mid = run.begin_run({}, "deepgap run", {}, "0")
        out = deepgap_cli("merge", x, "-o", s)
        assert out.returncode == 2
        err = out.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith("deepgap: error: cannot merge into ")
        assert f"pid {os.getpid()}" in err and "being written" in err
        late = run.begin_run({}, "deepgap run", {}, "0")  # the run goes on writing, into the same file
    finally:
        run.close()
    ids = [r for r, _ in _runs(s)]
    assert mid in ids and late in ids
    assert deepgap_cli("merge", x, "-o", s).returncode == 0  # once the run is done
    merged = [r for r, _ in _runs(s)]
    assert set(ids) < set(merged) and len(merged) == len(ids) + 1


def test_redact_in_place_during_a_run_refuses(tmp_path, stores):
    s, _ = stores
    hosts = _runs(s)
    run = Store(s)
    try:
        out = deepgap_cli("merge", s, "-o", s, "--redact")
        run.begin_run({}, "deepgap run", {}, "0")
    finally:
        run.close()
    assert out.returncode == 2 and "being written" in out.stderr
    assert _runs(s)[:1] == hosts  # not redacted behind the run's back, and the run's rows are there
    assert len(_runs(s)) == 2
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite", "x.sqlite"]


def test_a_run_waits_for_a_merge_in_another_process_and_names_it(tmp_path, stores):
    s, _ = stores
    code = (
        "import sys; from deepgap.store import writelock\n"
        "lock = writelock.acquire(sys.argv[1], True, 'merge into')\n"
        "print('held', flush=True); sys.stdin.read(); lock.release()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, s, "merge", "x.sqlite", "-o", s],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(Exception) as exc:
            Store(s)
        assert f"pid {proc.pid}" in str(exc.value) and "being rewritten" in str(exc.value)
        assert deepgap_cli("check", s).stdout.splitlines()[0].startswith(f"{s}: ok (in use by pid {proc.pid}")
    finally:
        proc.communicate("", timeout=30)
    Store(s).close()  # released: the run goes ahead
    assert not os.path.exists(writelock.lock_path(s))


def test_appenders_share_the_lock(tmp_path, stores):
    s, _ = stores
    a, b = Store(s), Store(s)
    try:
        a.begin_run({}, "deepgap run", {}, "0")
        b.begin_run({}, "deepgap run", {}, "0")
    finally:
        a.close()
        b.close()
    assert len(_runs(s)) == 3
    assert not os.path.exists(writelock.lock_path(s))


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """``os.statvfs`` of tmp_path reports a full disk once ``state["full"]`` is set."""
    real = os.statvfs
    state = {"full": True}
    fake = collections.namedtuple("fake", "f_bavail f_frsize")

    def statvfs(path):
        if state["full"] and str(path).startswith(str(tmp_path)):
            return fake(3, 4096)
        return real(path)

    import deepgap.drive.prelude
    import deepgap.drive.sweep

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", FakeRunner)
    monkeypatch.setattr(deepgap.drive.prelude, "run_level", lambda *a, **k: None)
    return state


def _unfinished(s: str) -> None:
    con = sqlite3.connect(s)
    con.execute("UPDATE runs SET status = 'interrupted'")
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


@pytest.mark.parametrize("command", ["run --resume", "merge X -o S"])
def test_a_full_disk_is_named_and_leaves_no_log(tmp_path, stores, full_disk, command):
    s, x = stores
    _unfinished(s)
    before = _files(tmp_path)
    argv = {
        "run --resume": ["run", "--resume", "--store", s, "--quiet"],
        "merge X -o S": ["merge", x, "-o", s],
    }
    out = deepgap_cli(*argv[command])
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "full" in err, err
    assert "damaged" not in err.replace("not damaged", ""), err
    assert _files(tmp_path) == before  # unchanged, and no -wal, -shm, lock or temporary file


def test_a_disk_that_fills_while_a_writer_opens_the_store(tmp_path, stores, full_disk, monkeypatch):
    """SQLite meets the full disk sizing the log's index: it says "disk I/O error", the disk is full."""
    s, _ = stores
    full_disk["full"] = False
    before = _files(tmp_path)
    probe = sqlite3.connect(":memory:", factory=guard.Connection)
    cursor = type(probe.cursor())  # the store's cursor class: its errors are translated as SQLite's are
    probe.close()
    real = cursor.execute

    def fail():
        raise sqlite3.OperationalError("disk I/O error")

    def execute(self, sql, *args):
        if sql.startswith("PRAGMA journal_mode = WAL"):
            path = self.connection.store_path
            for f in (path + "-wal", path + "-shm"):  # what SQLite made before it failed
                open(f, "ab").close()
            full_disk["full"] = True
            return self._wrap(fail)
        return real(self, sql, *args)

    monkeypatch.setattr(cursor, "execute", execute)
    with pytest.raises(Exception) as exc:
        Store(s)
    assert "full" in str(exc.value) and "damaged pages" not in str(exc.value)
    assert _files(tmp_path) == before
