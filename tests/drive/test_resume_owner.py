"""`run --resume` never takes over a run that a live deepgap process on this host is still measuring.

Before: a second process resumed it; both measured the same configurations and said they stored them, and the
store kept the first one's rows (the second's were ignored as duplicates)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from deepgap.cli import main
from deepgap.drive.session import live_owner
from deepgap.store import Store


def _running_run(path: str, pid: int) -> str:
    s = Store(path)
    run = s.begin_run(
        {"models": ["tinycnn"], "device": "cpu"}, "deepgap run (fixture)", {"device": "cpu"}, "0"
    )
    s.close()
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET pid=? WHERE run_id=?", (pid, run))
    con.commit()
    con.close()
    return run


def _started(args: list[str]) -> subprocess.Popen:
    """A process running ``args``, returned once its command line is theirs.

    Why wait: `Popen` returns when the child is forked, and until it has exec'd, its command line is this
    test process's, so on a loaded machine `live_owner` read pytest's (session 42's clean-clone run failed so).
    """
    import time

    import psutil

    p = subprocess.Popen(args)
    for _ in range(500):  # at most ~10 s
        try:
            if psutil.Process(p.pid).cmdline() == args:
                return p
        except psutil.Error:
            pass
        time.sleep(0.02)
    p.kill()
    raise AssertionError(f"the child never ran {args}")


@pytest.fixture
def owner():
    """A live process whose command line names deepgap, as a running `deepgap run` does."""
    p = _started([sys.executable, "-c", "import time; time.sleep(60)", "deepgap"])
    yield p.pid
    p.kill()
    p.wait()


def test_resume_refuses_a_run_its_owner_still_measures(tmp_path, capsys, owner):
    store = str(tmp_path / "s.sqlite")
    run = _running_run(store, owner)
    assert main(["run", "--resume", "--store", store]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        f"run {run} is still being measured by deepgap process {owner}" in err and len(err.splitlines()) == 1
    )


def test_a_dead_or_foreign_owner_does_not_hold_its_run(tmp_path, owner):
    import os
    import socket

    row = {"status": "running", "pid": owner, "host": socket.gethostname()}
    assert live_owner(row) == owner
    assert live_owner({**row, "host": "another-host"}) is None  # a fleet's other machine: not ours to check
    assert live_owner({**row, "status": "interrupted"}) is None
    assert live_owner({**row, "pid": os.getpid()}) is None  # this very process (an in-process resume)
    foreign = _started([sys.executable, "-c", "import time; time.sleep(60)"])  # a reused pid
    try:
        assert live_owner({**row, "pid": foreign.pid}) is None
    finally:
        foreign.kill()
        foreign.wait()
