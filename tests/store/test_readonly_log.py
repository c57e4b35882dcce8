"""Issue 46: a killed run's store on a read-only folder is read with its write-ahead log, never short.

Before, readers opened such a store without its log (SQLite cannot make the log's index there), so
``export`` gave 4 rows of 5 and ``check`` said ok. Now the file and its log are read through a private
copy (`deepgap.store.logcopy`). The machine's tests run as root, for whom no folder is read-only, so the
folder's "not writable" answer is faked where the code asks it (``os.access``).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store, write_cpu_run

from deepgap.cli import main
from deepgap.store import Store, logcopy


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[str, int]:
    """A store whose second run is only in its log (copied while the writer was open: a kill -9)."""
    work = tmp_path_factory.mktemp("work")
    path = str(work / "s.sqlite")
    build_store(path, gpu=False)
    s = Store(path)
    s.con.execute("PRAGMA wal_autocheckpoint = 0")
    write_cpu_run(s, "Second CPU")
    n = s.con.execute("SELECT count(*) FROM results").fetchone()[0]
    folder = tmp_path_factory.mktemp("readonly")
    for suffix in ("", "-wal"):
        shutil.copyfile(path + suffix, str(folder / "s.sqlite") + suffix)
    s.close()
    return str(folder / "s.sqlite"), n


@pytest.fixture
def readonly_folder(killed, monkeypatch):
    folder = os.path.dirname(killed[0])
    real = os.access

    def access(path, mode, *a, **kw):
        if os.path.abspath(path) == folder and mode & os.W_OK:
            return False
        return real(path, mode, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    return killed


def test_readers_see_the_rows_in_the_log(readonly_folder, tmp_path):
    path, n = readonly_folder
    before = sorted(os.listdir(os.path.dirname(path)))
    r = deepgap_cli("export", path, "-o", str(tmp_path / "out.csv"))
    assert r.returncode == 0 and f"wrote {n} rows" in r.stdout, (r.stdout, r.stderr)
    r = deepgap_cli("show", path, "--all", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == n, r.stdout[:300]
    r = deepgap_cli("check", path)
    assert r.returncode == 0 and f"results: {n} row(s) read" in r.stdout, r.stdout
    r = deepgap_cli("merge", path, "-o", str(tmp_path / "m.sqlite"))
    assert r.returncode == 0 and f"{n} results" in r.stdout, r.stdout
    assert sorted(os.listdir(os.path.dirname(path))) == before  # only read: no -shm made beside it


# --- a log that holds nothing SQLite reads (issue 46: check and --recover left a -shm beside it) ---------
def test_a_real_log_is_read_and_a_damaged_first_frame_makes_it_garbage(killed, tmp_path):
    path, _ = killed
    assert not logcopy.log_is_garbage(path) and logcopy.log_has_rows(path)
    copy = str(tmp_path / "c.sqlite")
    shutil.copyfile(path, copy)
    log = bytearray(open(path + "-wal", "rb").read())  # noqa: SIM115
    log[32 + 24 + 100] ^= 1  # a byte of the first frame's page: its checksum no longer holds
    (tmp_path / "c.sqlite-wal").write_bytes(bytes(log))
    assert logcopy.log_is_garbage(copy) and not logcopy.log_has_rows(copy)


def test_a_garbage_log_is_ignored_and_leaves_no_shm(tmp_path, capsys):
    folder = tmp_path / "store"
    folder.mkdir()
    path = str(folder / "s.sqlite")
    build_store(path, gpu=False)
    (folder / "s.sqlite-wal").write_bytes(bytes(range(256)) * 20)
    before = sorted(os.listdir(folder))
    out = tmp_path / "out"
    assert main(["check", path]) == 0
    assert "hold no transaction SQLite can read" in capsys.readouterr().out
    assert main(["check", path, "--recover", str(out / "r.sqlite")]) == 0
    assert "log folded in" not in capsys.readouterr().out
    assert main(["show", path]) == 0
    assert main(["export", path, "-o", str(out / "x.csv")]) == 0
    assert main(["merge", path, "-o", str(out / "m.sqlite")]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(folder)) == before  # no -shm beside it
    assert sorted(os.listdir(out)) == ["m.sqlite", "r.sqlite", "x.csv"]
