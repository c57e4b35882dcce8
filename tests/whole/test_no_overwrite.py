"""Issue 46: no output ever replaces an input, whatever name reaches it (the same name, a symbolic or a
hard link, the store's own log). Before, ``export s -o s`` replaced the store by its CSV, ``report`` by
a page, ``compare … -o`` by a CSV, and ``run --store s --report s`` by a report after measuring; all
exited 0. Each case here is one line, exit 2, and the store's bytes unchanged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("master") / "s.sqlite")
    build_store(path, cpu=False)
    return path


@pytest.fixture
def store(master, tmp_path) -> str:
    path = str(tmp_path / "s.sqlite")
    shutil.copyfile(master, path)
    os.symlink(path, tmp_path / "link.sqlite")
    os.link(path, tmp_path / "hard.sqlite")
    return path


COMMANDS = {
    "export": ["export", "{s}", "-o", "{o}"],
    "report": ["report", "{s}", "-o", "{o}", "--static"],
    "report-screenshot": ["report", "{s}", "-o", "{d}/r.html", "--screenshot", "{o}"],
    "compare": ["compare", "{s}", "{s}", "-o", "{o}"],
    "check-recover": ["check", "{s}", "--recover", "{o}"],
    "run-report": ["run", "--store", "{s}", "--report", "{o}", "--models", "tinycnn", "--device", "cpu"],
}


@pytest.mark.parametrize("via", ["s.sqlite", "link.sqlite", "hard.sqlite"])
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_output_onto_an_input_is_refused(store, via, cmd):
    folder = os.path.dirname(store)
    before = Path(store).read_bytes()
    argv = [a.format(s=store, o=os.path.join(folder, via), d=folder) for a in COMMANDS[cmd]]
    r = deepgap_cli(*argv)
    assert r.returncode == 2, r.stderr
    assert "are one file" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert Path(store).read_bytes() == before
    assert not os.path.exists(os.path.join(folder, "r.html"))


@pytest.mark.parametrize("cmd", sorted(set(COMMANDS) - {"check-recover"}))
def test_an_output_onto_another_store_is_refused(store, cmd):
    """Session 33: ``export a -o b.sqlite`` (and report, its screenshot, compare, ``run --report``) replaced
    another store, not an input of the command, by CSV or HTML and exited 0."""
    folder = os.path.dirname(store)
    other = os.path.join(folder, "other.sqlite")
    shutil.copyfile(store, other)
    before = Path(other).read_bytes()
    source = os.path.join(folder, "new.sqlite") if cmd == "run-report" else store
    r = deepgap_cli(*[a.format(s=source, o=other, d=folder) for a in COMMANDS[cmd]])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "is an SQLite store: writing the" in r.stderr and "would replace its measurements" in r.stderr
    assert Path(other).read_bytes() == before
    assert not os.path.exists(os.path.join(folder, "r.html")) and not os.path.exists(source + "-journal")


def test_output_onto_a_stores_log_is_refused(store):
    wal = store + "-wal"
    with open(wal, "wb") as fh:  # stands for a killed run's log: its newest rows
        fh.write(b"log")
    r = deepgap_cli("export", store, "-o", wal)
    assert r.returncode == 2 and "the wal file of store" in r.stderr, r.stderr
    assert Path(wal).read_bytes() == b"log"


TINY = ["--models", "tinycnn", "--device", "cpu"]
NEW_NAME_CASES = {
    # before: the run measured into the new store, then replaced it by its report (exit 0)
    "run-report": ["run", "--store", "{d}/new.sqlite", "--report", "{d}/new.sqlite", *TINY],
    "run-report-log": ["run", "--store", "{d}/new.sqlite", "--report", "{d}/new.sqlite-wal", *TINY],
    # before: the screenshot replaced the page it was taken of
    "report-screenshot": ["report", "{s}", "-o", "{d}/r.html", "--screenshot", "{d}/r.html", "--static"],
}


@pytest.mark.parametrize("cmd", sorted(NEW_NAME_CASES))
def test_two_outputs_of_one_new_name_are_refused(store, cmd):
    """Outputs that do not exist yet have no identity: they are compared by their resolved names."""
    folder = os.path.dirname(store)
    before = sorted(os.listdir(folder))
    r = deepgap_cli(*[a.format(s=store, d=folder) for a in NEW_NAME_CASES[cmd]])
    assert r.returncode == 2, r.stderr
    assert "are one file: one would replace the other" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(os.listdir(folder)) == before


COMPANION_CASES = {
    # before: a store written as s.sqlite-journal was deleted the next time s.sqlite was opened
    "run": ["run", "--store", "{s}-journal", "--models", "tinycnn", "--device", "cpu"],
    "merge": ["merge", "{s}", "-o", "{s}-shm"],
    "check-recover": ["check", "{s}", "--recover", "{s}-wal"],
    "export": ["export", "{s}", "-o", "{s}-wal"],
    "report": ["report", "{s}", "-o", "{s}-wal", "--static"],
}


@pytest.mark.parametrize("cmd", sorted(COMPANION_CASES))
def test_a_path_named_as_a_stores_log_is_refused(store, cmd):
    """A new file named as SQLite names a store's log, journal or shm: one line, exit 2, nothing made."""
    folder = os.path.dirname(store)
    before = sorted(os.listdir(folder))
    r = deepgap_cli(*[a.format(s=store) for a in COMPANION_CASES[cmd]])
    assert r.returncode == 2, r.stderr
    # the input's own log is caught as an input's companion; any other database's by its name
    said = ("is the name SQLite gives to", "file of store")
    assert any(w in r.stderr for w in said) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""  # check --recover refuses before it reports on the store
    assert sorted(os.listdir(folder)) == before


def test_a_log_like_name_beside_no_database_is_an_ordinary_output(store, tmp_path):
    out = tmp_path / "notes.csv-wal"  # notes.csv is no database: nothing would take this for its log
    assert deepgap_cli("export", store, "-o", str(out)).returncode == 0
    assert out.read_text().startswith("result_id")


def test_a_new_output_and_stdout_still_work(store, tmp_path):
    assert deepgap_cli("export", store, "-o", str(tmp_path / "out.csv")).returncode == 0
    r = deepgap_cli("export", store, "-o", "-")
    assert r.returncode == 0 and "config_key" in r.stdout.splitlines()[0]


def test_report_never_replaces_a_folder_it_did_not_make(store, tmp_path):
    """Before, ``report -o my.html`` renamed an existing ``my_files/`` away and deleted it."""
    mine = tmp_path / "my_files"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    r = deepgap_cli("report", store, "-o", str(tmp_path / "my.html"), "--static")
    assert r.returncode == 2 and "deepgap did not make it" in r.stderr, r.stderr
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert not (tmp_path / "my.html").exists()


def test_a_report_never_deletes_a_store_put_in_its_files_folder(store, tmp_path):
    """A deepgap-made ``r_files/`` holding a store: ``report … -o r.html`` deleted the store with the folder
    (the store could be the report's own input), and ``run --store r_files/new.sqlite --report r.html``
    measured and then deleted what it measured."""
    assert deepgap_cli("report", store, "-o", str(tmp_path / "r.html"), "--static").returncode == 0
    mine = tmp_path / "r_files" / "mine.sqlite"
    shutil.copyfile(store, mine)
    r = deepgap_cli("report", str(mine), "-o", str(tmp_path / "r.html"), "--static")
    assert r.returncode == 2 and "holds files a report does not write (mine.sqlite)" in r.stderr, r.stderr
    assert mine.exists()
    mine.unlink()
    new = tmp_path / "r_files" / "new.sqlite"
    r = deepgap_cli("run", "--store", str(new), "--report", str(tmp_path / "r.html"), *TINY)
    assert r.returncode == 2 and "the folder --report" in r.stderr and not new.exists(), r.stderr


@pytest.mark.parametrize("cmd", ["run", "merge", "check-recover"])
def test_a_new_store_never_takes_in_a_log_left_without_its_store(store, tmp_path, cmd):
    """``o.sqlite-wal`` without ``o.sqlite`` (a killed run's log, copied away): a new ``o.sqlite`` took in its
    rows (merge, --recover: another run showed up in the output) or deleted it (run)."""
    new = tmp_path / "o.sqlite"
    (tmp_path / "o.sqlite-wal").write_bytes(b"someone's rows")
    argv = {
        "run": ["run", "--store", str(new), *TINY],
        "merge": ["merge", store, "-o", str(new)],
        "check-recover": ["check", store, "--recover", str(new)],
    }[cmd]
    r = deepgap_cli(*argv)
    assert r.returncode == 2 and "exists without its store" in r.stderr, r.stderr
    assert (tmp_path / "o.sqlite-wal").read_bytes() == b"someone's rows" and not new.exists()


def test_a_log_name_beside_a_fifo_neither_blocks_nor_is_refused(store, tmp_path):
    """The log-name check read the base file's header to see if it is a database: a FIFO there blocked it."""
    import subprocess
    import sys

    os.mkfifo(tmp_path / "pipe")
    out = tmp_path / "pipe-wal"
    r = subprocess.run(
        [sys.executable, "-m", "deepgap", "export", store, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith("result_id")


def test_export_makes_missing_folders_as_report_does_and_a_failed_write_leaves_none(store, tmp_path):
    """export -o into folders that do not exist yet was refused while report -o, merge -o and a new store made them."""
    from deepgap.store.paths import make_folders, remove_folders

    out = tmp_path / "new" / "deeper" / "out.csv"
    assert deepgap_cli("export", store, "-o", str(out)).returncode == 0
    assert out.read_text().startswith("result_id")
    made = make_folders(str(tmp_path / "a" / "b" / "c"))
    assert made == [str(tmp_path / "a" / "b" / "c"), str(tmp_path / "a" / "b"), str(tmp_path / "a")]
    remove_folders(made)  # what a failed write does: the folders it made go again
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")
    r = deepgap_cli("export", store, "-o", str(tmp_path / "file" / "out.csv"))
    assert (
        r.returncode == 2
        and "is a file, not a folder" in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )
