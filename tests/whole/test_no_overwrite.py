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


def test_output_onto_a_stores_log_is_refused(store):
    wal = store + "-wal"
    with open(wal, "wb") as fh:  # stands for a killed run's log: its newest rows
        fh.write(b"log")
    r = deepgap_cli("export", store, "-o", wal)
    assert r.returncode == 2 and "the wal file of store" in r.stderr, r.stderr
    assert Path(wal).read_bytes() == b"log"


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
