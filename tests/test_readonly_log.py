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

from deepgap.store import Store


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
