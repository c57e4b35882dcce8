"""A full disk (issue 46): readers still read, ``--recover`` and ``run`` say so in one line, nothing is left.

The disk is a real one where this process may mount a 2 MiB tmpfs (root, as on the CI machine), filled
to the last block; elsewhere `os.statvfs` reports the folder full and copies into it fail with ENOSPC
(SQLite's own writes cannot be intercepted there, but each test then still sees any -shm a reader
made in place, and any advice that fails). Both ways run everywhere: nothing here skips.
"""

from __future__ import annotations

import collections
import errno
import os
import shutil
import subprocess

import pytest
from fixtures_store import build_store, write_cpu_run

from deepgap.cli import main
from deepgap.store import Store


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[str, int]:
    """A store whose second run is only in its log (copied while its writer was open), and its result count."""
    work = tmp_path_factory.mktemp("killed")
    path = str(work / "w.sqlite")
    build_store(path, gpu=False)
    s = Store(path)
    s.con.execute("PRAGMA wal_autocheckpoint = 0")
    write_cpu_run(s, "Second CPU")
    n = s.con.execute("SELECT count(*) FROM results").fetchone()[0]
    for suffix in ("", "-wal"):
        shutil.copyfile(path + suffix, str(work / "s.sqlite") + suffix)
    s.close()
    return str(work / "s.sqlite"), n


class FullDisk:
    """A folder on a full disk: `fill` after putting files there; `free` gives the room back."""

    def __init__(self, folder, monkeypatch) -> None:
        self.folder = str(folder)
        os.makedirs(self.folder)
        self.real = os.geteuid() == 0 and self._mount()
        self.mp = monkeypatch
        self.full = False

    def _mount(self) -> bool:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", self.folder], capture_output=True, check=False
        )
        return r.returncode == 0

    def fill(self) -> None:
        self.full = True
        if self.real:
            fd = os.open(os.path.join(self.folder, "fill"), os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            finally:
                os.close(fd)
            return
        real_statvfs, real_copy = os.statvfs, shutil.copyfile
        fake = collections.namedtuple("fake", "f_bavail f_frsize")

        def inside(p) -> bool:
            return self.full and os.path.abspath(str(p)).startswith(self.folder)

        def copyfile(src, dst, **kw):
            if inside(dst):
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
            return real_copy(src, dst, **kw)

        self.mp.setattr(os, "statvfs", lambda p: fake(0, 4096) if inside(p) else real_statvfs(p))
        self.mp.setattr(shutil, "copyfile", copyfile)

    def free(self) -> None:
        self.full = False
        if self.real:
            os.remove(os.path.join(self.folder, "fill"))

    def files(self) -> list[str]:
        return sorted(f for f in os.listdir(self.folder) if f != "fill")

    def close(self) -> None:
        if self.real:
            subprocess.run(["umount", "-l", self.folder], check=False)


@pytest.fixture
def disk(tmp_path, monkeypatch):
    d = FullDisk(tmp_path / "full", monkeypatch)
    try:
        yield d
    finally:
        d.close()


def test_a_store_with_a_log_on_a_full_disk_is_read_and_gets_no_shm(disk, killed, tmp_path, capsys):
    path, n = killed
    for suffix in ("", "-wal"):
        shutil.copyfile(path + suffix, os.path.join(disk.folder, "s.sqlite" + suffix))
    disk.fill()
    store = os.path.join(disk.folder, "s.sqlite")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["export", store, "-o", str(out / "x.csv")]) == 0
    assert f"wrote {n} rows" in capsys.readouterr().out  # the log's rows included
    assert main(["check", store]) == 0
    assert f"results: {n} row(s) read" in capsys.readouterr().out
    assert main(["show", store, "--all"]) == 0
    assert main(["merge", store, "-o", str(out / "m.sqlite")]) == 0
    capsys.readouterr()
    assert disk.files() == ["s.sqlite", "s.sqlite-wal"]  # no -shm beside it


def test_recover_into_a_full_disk_is_one_line_and_writes_nothing(disk, killed, tmp_path, capsys):
    path, _ = killed
    src = str(tmp_path / "d.sqlite")
    shutil.copyfile(path, src)  # the main file alone: its first run
    disk.fill()
    new = os.path.join(disk.folder, "r.sqlite")
    assert main(["check", src, "--recover", new]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is full" in err and "nothing was recovered" in err, err
    assert disk.files() == [] and sorted(os.listdir(tmp_path)) == ["d.sqlite", "full"]
    disk.free()  # the advice works once there is room
    assert main(["check", src, "--recover", new]) == 0
    assert disk.files() == ["r.sqlite"]


def test_run_on_a_new_store_on_a_full_disk_gives_advice_that_works(disk, capsys, monkeypatch):
    from test_damaged_stores import FakeRunner

    import deepgap.drive.prelude
    import deepgap.drive.sweep

    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", FakeRunner)
    monkeypatch.setattr(deepgap.drive.prelude, "run_level", lambda *a, **k: None)
    disk.fill()
    store = os.path.join(disk.folder, "new.sqlite")
    argv = [
        "run",
        "--models",
        "tinycnn",
        "--batch-sizes",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--store",
        store,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is full" in err and "nothing was written" in err, err
    assert "--resume" not in err and "keeps everything" not in err, err  # there is nothing to resume
    assert disk.files() == []
    assert main(["run", "--resume", "--store", store, "--quiet"]) == 2  # what the old advice led to
    capsys.readouterr()
    disk.free()
    # what the advice says: the same command again, once there is room (it runs; the fake runner's one row
    # is an error, so nothing was measured: exit 1, not 2)
    assert main(argv) == 1
    assert "no configuration was measured (1 error)" in capsys.readouterr().err
    assert disk.files() == ["new.sqlite"]
