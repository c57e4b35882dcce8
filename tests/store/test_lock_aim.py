"""Issue 46: the write lock cannot be aimed, and covers the file, not one of its names.

Before: with ``s.sqlite-lock → victim.txt``, ``merge x -o s`` truncated victim.txt to a JSON line and
``run`` appended to it; two runs through a store and a hard link of it both wrote (each name its own
log), and results vanished; ``DEEPGAP_LOCK_WAIT_S=abc`` was a traceback at import, ``nan`` a wait
without end; lines of killed holders stayed in the lock file.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store

from deepgap.core.errors import StoreError, UsageError
from deepgap.store import Store, writelock


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("lockm") / "s.sqlite")
    build_store(path, gpu=False)
    return path


@pytest.fixture
def store(master, tmp_path) -> str:
    path = str(tmp_path / "s.sqlite")
    shutil.copyfile(master, path)
    return path


@pytest.fixture(autouse=True)
def short_wait(monkeypatch):
    monkeypatch.setattr(writelock, "WAIT_S", 0.2)


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_lock_file_aimed_at_another_file_is_refused(store, tmp_path, how, master):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (os.symlink if how == "symlink" else os.link)(victim, store + "-lock")
    with pytest.raises(StoreError, match="not deepgap's lock"):
        Store(store).close()  # what a run does
    r = deepgap_cli("merge", master, "-o", store)
    assert r.returncode == 2 and "not deepgap's lock" in r.stderr, r.stderr
    assert victim.read_text() == "precious\n"


def test_a_store_with_two_names_is_not_written(store, tmp_path):
    other = str(tmp_path / "hard.sqlite")
    os.link(store, other)
    for name in (store, other):
        with pytest.raises(StoreError, match="hard links"):
            Store(name).close()
    r = deepgap_cli("merge", store, "-o", other)
    assert r.returncode == 2 and "hard links" in r.stderr, r.stderr
    Store(other, readonly=True).close()  # reading stays possible


def test_stale_holders_are_dropped(store):
    with open(store + "-lock", "w") as fh:  # a holder killed by -9: its line stayed, its flock went
        fh.write(
            json.dumps({"pid": 2**22 + 12345, "mode": "shared", "since": 0, "command": "deepgap run"}) + "\n"
        )
    lock = writelock.acquire(store, False, "write to")
    try:
        with open(store + "-lock") as fh:
            lines = [json.loads(x) for x in fh]
        assert [d["pid"] for d in lines] == [os.getpid()]
    finally:
        lock.release()
    assert not os.path.exists(store + "-lock")


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-1"])
def test_a_bad_lock_wait_is_one_line(store, tmp_path, monkeypatch, value, master):
    monkeypatch.setattr(writelock, "WAIT_S", None)
    monkeypatch.setenv("DEEPGAP_LOCK_WAIT_S", value)
    with pytest.raises(UsageError, match="DEEPGAP_LOCK_WAIT_S"):
        writelock.default_wait_s()
    r = deepgap_cli("merge", master, "-o", str(tmp_path / "m.sqlite"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "DEEPGAP_LOCK_WAIT_S" in r.stderr, r.stderr


def test_resume_of_an_unknown_run_leaves_no_lock(store):
    r = deepgap_cli("run", "--store", store, "--resume", "nosuch-id")
    assert r.returncode == 2 and "no run 'nosuch-id'" in r.stderr, r.stderr
    assert not os.path.exists(store + "-lock")
