"""Bad inputs that used to get through: one line, exit 2, no traceback, files byte-identical, nothing new.

No case may reach a measurement: the sweep runner is replaced by one that fails the test if started.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.core.records import Result, Status
from deepgap.drive.launcher import Finished
from deepgap.store import Store

RUN = ["run", "--models", "tinycnn", "--batch-sizes", "1", "--device", "cpu", "--quiet"]


class NoRunner:
    """A sweep runner that must never be started: each case here fails before measuring."""

    def __init__(self, sweep, device):
        pass

    def start(self):
        raise AssertionError("a bad input reached the measurement")


@pytest.fixture(autouse=True)
def no_runner(monkeypatch):
    import deepgap.api
    import deepgap.drive.sweep

    monkeypatch.setattr(deepgap.api, "SweepRunner", NoRunner)  # probe
    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", NoRunner)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = str(tmp_path_factory.mktemp("good") / "s.sqlite")
    build_store(path, gpu=False)
    with open(path, "rb") as fh:
        return fh.read()


def _new(t):
    return str(t / "n.sqlite")


def _store(t, good):
    p = t / "s.sqlite"
    p.write_bytes(good)
    return str(p)


def _weights(t, kind):
    import torch

    p = t / "w.pt"
    if kind == "junk":
        p.write_bytes(b"\x00not a torch file" * 10)
    elif kind == "not a state dict":
        torch.save({"epoch": 3, "lr": 0.1}, p)
    elif kind == "list":
        torch.save([torch.zeros(2)], p)
    else:  # another model's shapes
        torch.save({"stem.0.weight": torch.zeros(3, 3)}, p)
    return str(p)


def _binary(t):
    p = t / "sweep.toml"
    p.write_bytes(bytes(range(256)) * 4)
    return str(p)


CASES = [
    # (id, argv builder (tmp_path, good store bytes), words in the message)
    (
        "empty batch item",
        lambda t, g: RUN[:3] + ["--batch-sizes", "1,,2", "--store", str(t / "n.sqlite")],
        "empty item",
    ),
    ("trailing comma", lambda t, g: ["run", "--models", "tinycnn,", "--store", _new(t)], "empty item"),
    (
        "empty precision item",
        lambda t, g: RUN + ["--precisions", "fp32,,fp16", "--store", _new(t)],
        "empty item",
    ),
    ("empty threads item", lambda t, g: RUN + ["--threads", ",1", "--store", _new(t)], "empty item"),
    (
        "weights junk",
        lambda t, g: RUN + ["--weights", _weights(t, "junk"), "--store", str(t / "n.sqlite")],
        "cannot be loaded",
    ),
    (
        "weights not a state dict",
        lambda t, g: RUN + ["--weights", _weights(t, "not a state dict"), "--store", str(t / "n.sqlite")],
        "not a state dict",
    ),
    (
        "weights a list",
        lambda t, g: RUN + ["--weights", _weights(t, "list"), "--store", str(t / "n.sqlite")],
        "not a state dict",
    ),
    (
        "weights of another model",
        lambda t, g: RUN + ["--weights", _weights(t, "other"), "--store", str(t / "n.sqlite")],
        "does not fit",
    ),
    (
        "weights junk, several GPUs",
        lambda t, g: (
            RUN + ["--weights", _weights(t, "junk"), "--devices", "all", "--store", str(t / "n.sqlite")]
        ),
        "cannot be loaded",
    ),
    (
        "binary config",
        lambda t, g: ["run", "--config", _binary(t), "--store", str(t / "n.sqlite")],
        "not a text file",
    ),
    (
        "config is a folder",
        lambda t, g: ["run", "--config", str(t), "--store", str(t / "n.sqlite")],
        "cannot be read",
    ),
    (
        "run --report unwritable",
        lambda t, g: RUN + ["--report", "/proc/deepgap/r.html", "--store", str(t / "n.sqlite")],
        "cannot write",
    ),
    ("report -o unwritable", lambda t, g: ["report", _store(t, g), "-o", "/proc/dg/r.html"], "cannot write"),
    ("export -o unwritable", lambda t, g: ["export", _store(t, g), "-o", "/proc/dg.csv"], "cannot write"),
    ("empty --store", lambda t, g: RUN + ["--store", ""], "store path is empty"),
    ("blank --store", lambda t, g: RUN + ["--store", "  "], "store path is empty"),
    ("merge S -o S", lambda t, g: ["merge", _store(t, g), "-o", str(t / "s.sqlite")], "nothing to merge"),
    ("show unknown run", lambda t, g: ["show", _store(t, g), "--run", "20990101-000000-abcdef"], "no run"),
    (
        "export unknown run",
        lambda t, g: ["export", _store(t, g), "--run", "nope", "-o", str(t / "x.csv")],
        "no run",
    ),
    (
        "report unknown run",
        lambda t, g: ["report", _store(t, g), "--run", "nope", "-o", str(t / "r.html")],
        "no run",
    ),
    ("show empty file", lambda t, g: ["show", str(t / "e.sqlite")], "empty"),
    ("check missing store", lambda t, g: ["check", str(t / "none.sqlite")], "does not exist"),
    ("recover onto itself", lambda t, g: ["check", _store(t, g), "--recover", str(t / "s.sqlite")], "itself"),
]


@pytest.mark.parametrize("argv_fn, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, capsys, good, argv_fn, words):
    (tmp_path / "e.sqlite").write_bytes(b"")
    argv = argv_fn(tmp_path, good)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if (tmp_path / n).is_file()}
    dirs = sorted(os.listdir(tmp_path))
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("deepgap: error: ") and words in err.lower(), err
    assert "Traceback" not in err and ";" in err
    assert sorted(os.listdir(tmp_path)) == dirs  # nothing new: no store, no -wal/-shm, no output
    for n, b in before.items():
        assert (tmp_path / n).read_bytes() == b, n


def test_good_weights_pass_the_check(tmp_path):
    """The check before the sweep accepts the model's own state dict (so the cases above can fail)."""
    import torch

    from deepgap.measure.models.build import build_model, check_weights

    p = tmp_path / "w.pt"
    torch.save(build_model("tinycnn", 32).state_dict(), p)
    check_weights("tinycnn", 32, str(p))


class StoringRunner:
    """Yields finished configurations with many samples each, so a small page limit fills up."""

    def __init__(self, sweep, device):
        pass

    def start(self):
        pass

    def environment(self):
        return {"host": "test", "device_name": "cpu"}

    def prelude(self, measure, configs):
        measure("", self, configs)  # the test patches run_level out

    def results(self, configs):
        for cfg in configs:
            res = Result(spec=cfg, status=Status.ERROR, reason="x" * 1000, samples_s=[[0.001] * 4000])
            yield Finished("", res)

    def restart(self):
        pass

    def close(self):
        pass


def test_full_disk_during_run_keeps_finished_configurations(tmp_path, capsys, monkeypatch):
    import deepgap.drive.prelude
    import deepgap.drive.sweep

    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", StoringRunner)
    monkeypatch.setattr(deepgap.drive.prelude, "run_level", lambda *a, **k: None)
    begin = Store.begin_run

    def begin_then_limit(self, *a, **k):
        run_id = begin(self, *a, **k)
        pages = self.con.execute("PRAGMA page_count").fetchone()[0]
        self.con.execute(f"PRAGMA max_page_count = {pages + 20}")  # room for two configurations
        return run_id

    monkeypatch.setattr(Store, "begin_run", begin_then_limit)
    store = str(tmp_path / "s.sqlite")
    rc = main(RUN[:3] + ["--batch-sizes", "1,2,3,4,5,6", "--device", "cpu", "--store", store, "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "is full" in err and "--resume" in err
    s = Store(store, readonly=True)
    kept = len(s.results_frame())
    s.close()
    assert 1 <= kept < 6 and f"the {kept} configuration(s)" in err
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_full_disk_during_merge_leaves_output_unchanged(tmp_path, capsys, monkeypatch):
    import deepgap.fleet.merge

    class SmallStore(Store):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            if not k.get("readonly"):
                self.con.execute("PRAGMA max_page_count = 12")

    monkeypatch.setattr(deepgap.fleet.merge, "Store", SmallStore)
    src = str(tmp_path / "a.sqlite")
    build_store(src)
    before = Path(src).read_bytes()
    rc = main(["merge", src, "-o", str(tmp_path / "all.sqlite")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "disk is full" in err and "unchanged" in err, err
    assert sorted(os.listdir(tmp_path)) == ["a.sqlite"] and Path(src).read_bytes() == before


def test_read_only_folder_reads_without_writing(tmp_path, capsys, good, monkeypatch):
    """In a folder we may not write to, reading is immutable: it works and creates nothing."""
    import deepgap.store.guard

    s = _store(tmp_path, good)
    con = sqlite3.connect(s)  # a live writer's log, which an immutable read ignores
    con.execute("PRAGMA journal_mode = WAL")
    real_access = os.access
    folder = str(tmp_path)
    monkeypatch.setattr(
        deepgap.store.guard.os,
        "access",
        lambda p, mode, **k: (
            False if os.path.abspath(p) == folder and mode & os.W_OK else real_access(p, mode, **k)
        ),
    )
    assert deepgap.store.guard.immutable_read(s)
    assert main(["show", s]) == 0
    con.close()
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_run_that_stores_nothing_removes_its_new_store(tmp_path):
    p = str(tmp_path / "new.sqlite")
    Store(p).close(discard_empty=True)
    assert not os.path.exists(p)
    Store(p).close()  # without discard_empty, an empty store is kept (others create stores on purpose)
    assert os.path.exists(p)
    s = Store(p)
    s.close(discard_empty=True)  # not created by this Store: kept
    assert os.path.exists(p)
