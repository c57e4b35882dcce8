"""Issue 39's hostile inputs: each gets one line, exit 2, nothing created, no hang, nothing replaced.

Every case failed on the code before: a traceback, a hang (a FIFO, 10^12 sweeps, a trace of rate
10^300), a silent acceptance (a seed past 64 bits, ``nan``, a mixed-label dataset) or a destroyed
file (an export onto a FIFO). No case may reach a measurement: the sweep runner fails the test if
started, and an alarm turns a hang into a failure.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from fixtures_store import build_store

from deepgap.cli import main

RUN = ["run", "--models", "tinycnn", "--batch-sizes", "1", "--device", "cpu", "--quiet"]
HANG_S = 20


class NoRunner:
    """A sweep runner that must never be started: each case here fails before measuring."""

    def __init__(self, sweep, device):
        pass

    def start(self):
        raise AssertionError("a bad input reached the measurement")

    def close(self):
        pass


class Hang(Exception):  # noqa: N818 - named for what the test saw
    pass


@pytest.fixture(autouse=True)
def no_runner_no_hang(monkeypatch):
    import deepgap.api
    import deepgap.drive.sweep

    monkeypatch.setattr(deepgap.api, "SweepRunner", NoRunner)  # probe
    monkeypatch.setattr(deepgap.drive.sweep, "SweepRunner", NoRunner)

    def hung(*_):
        raise Hang(f"still running after {HANG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    path = str(tmp_path_factory.mktemp("good") / "s.sqlite")
    build_store(path, gpu=False)
    return Path(path).read_bytes()


def _store(t, good):
    (t / "s.sqlite").write_bytes(good)
    return str(t / "s.sqlite")


def _toml(t, text):
    (t / "sweep.toml").write_text(text)
    return ["run", "--config", str(t / "sweep.toml"), "--device", "cpu", "--quiet", *_new(t)]


def _fifo(t):
    os.mkfifo(t / "pipe")
    return str(t / "pipe")


def _trace(t, text):
    (t / "trace.txt").write_text(text)
    return str(t / "trace.txt")


def _dataset(t, labels):
    rows = []
    for i, label in enumerate(labels):
        (t / f"{i}.png").write_bytes(b"")
        rows.append(f"{i}.png,{label}")
    (t / "data.csv").write_text("\n".join(rows) + "\n")
    return str(t / "data.csv")


def _new(t):
    return ["--store", str(t / "n.sqlite")]


SERVE = ["serve", "--model", "tinycnn", "--device", "cpu", "--scenario", "server", "--quiet"]
CASES = [
    # tracebacks
    ("store not UTF-8", lambda t, g: RUN + ["--store", os.fsdecode(bytes(t) + b"/bad\xff.sqlite")], "utf-8"),
    ("timeout inf", lambda t, g: RUN + ["--timeout", "inf"] + _new(t), "finite"),
    ("idle-time inf", lambda t, g: RUN + ["--idle-time", "inf"] + _new(t), "finite"),
    ("thermal-timeout inf", lambda t, g: RUN + ["--thermal-timeout", "inf"] + _new(t), "finite"),
    (
        "batch 10^20",
        lambda t, g: [*RUN[:3], "--batch-sizes", "99999999999999999999", "--device", "cpu", *_new(t)],
        "batch_sizes must be an integer in",
    ),
    ("threads 10^20", lambda t, g: RUN + ["--threads", "99999999999999999999"] + _new(t), "threads must be"),
    ("toml device = 5", lambda t, g: _toml(t, "device = 5\n"), "'device' must be a text"),
    ("toml max_time_s abc", lambda t, g: _toml(t, 'max_time_s = "abc"\n'), "must be a number"),
    ("toml sweep = 5", lambda t, g: _toml(t, "sweep = 5\n"), "sweep must be a table"),
    ("toml target_ci 1%", lambda t, g: _toml(t, 'target_ci = "1%"\n'), "target_ci = 0.01"),
    ("toml models [1]", lambda t, g: _toml(t, "models = [1]\n"), "list of texts"),
    ("toml options x", lambda t, g: _toml(t, 'options = "x"\n'), "must be a table"),
    ("sample-hz 1e-300", lambda t, g: RUN + ["--sample-hz", "1e-300"] + _new(t), "sample rate"),
    # hangs
    ("store is a FIFO", lambda t, g: RUN + ["--store", _fifo(t)], "fifo"),
    ("show a FIFO", lambda t, g: ["show", _fifo(t)], "fifo"),
    ("config is a FIFO", lambda t, g: ["run", "--config", _fifo(t)] + _new(t), "fifo"),
    ("sweeps 10^12", lambda t, g: RUN + ["--sweeps", "1000000000000"] + _new(t), "sweeps must be"),
    (
        "trace of rate 1e300",
        lambda t, g: [*SERVE, "--trace", _trace(t, "0\n1e-300\n"), *_new(t)],
        "mean rate",
    ),
    ("qps 1e-300", lambda t, g: SERVE + ["--qps", "1e-300"] + _new(t), "outside"),
    (
        "target-ci with max-time inf",
        lambda t, g: RUN + ["--target-ci", "1%", "--max-time", "inf"] + _new(t),
        "finite",
    ),
    # accepted silently
    ("seed past 64 bits", lambda t, g: RUN + ["--seed", "99999999999999999999999"] + _new(t), "seed must be"),
    (
        "serve seed past 64 bits",
        lambda t, g: [*SERVE, "--qps", "10", "--seed", "99999999999999999999999", *_new(t)],
        "--seed must be",
    ),
    ("toml seed x", lambda t, g: _toml(t, 'seed = "x"\n'), "'seed' must be an integer"),
    ("min-time nan", lambda t, g: RUN + ["--min-time", "nan"] + _new(t), "finite"),
    ("accuracy-samples -5", lambda t, g: RUN + ["--accuracy-samples", "-5"] + _new(t), "accuracy_samples"),
    (
        "unknown table beside [sweep]",
        lambda t, g: _toml(t, '[sweep]\nseed = 1\n[sweeps]\nmodels = ["x"]\n'),
        "beside the [sweep] table",
    ),
    ("dataset labels 3,cat", lambda t, g: RUN + ["--dataset", _dataset(t, ["3", "cat"])] + _new(t), "mixes"),
    (
        "dataset labels 0.5,1.5",
        lambda t, g: RUN + ["--dataset", _dataset(t, ["0.5", "1.5"])] + _new(t),
        "not a class index",
    ),
    # destructive, or leaving files
    ("export onto a FIFO", lambda t, g: ["export", _store(t, g), "-o", _fifo(t)], "would be replaced"),
    ("report onto a FIFO", lambda t, g: ["report", _store(t, g), "-o", _fifo(t)], "would be replaced"),
    (
        "store path of 5000 characters",
        lambda t, g: [*RUN, "--store", str(t / "/".join(["d" * 200] * 25)) + ".sqlite"],
        "too long",
    ),
    ("store name of 5000 characters", lambda t, g: RUN + ["--store", str(t / ("x" * 5000))], "too long"),
]


@pytest.mark.parametrize("argv_fn, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input(tmp_path, capsys, good, argv_fn, words):
    argv = argv_fn(tmp_path, good)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if (tmp_path / n).is_file()}
    kinds = {n: (tmp_path / n).is_fifo() for n in os.listdir(tmp_path)}
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("deepgap: error: ") and words.lower() in err.lower(), err
    assert "Traceback" not in err and ";" in err
    assert {n: (tmp_path / n).is_fifo() for n in os.listdir(tmp_path)} == kinds  # nothing new or replaced
    for n, b in before.items():
        assert (tmp_path / n).read_bytes() == b, n


def test_system_paths_are_never_replaced(tmp_path, capsys, good, monkeypatch):
    """``-o /dev/stdout`` or ``/dev/null`` (as root a rename would replace them) and ``--store /dev/null``."""
    import deepgap.commands.export

    def replace(src, dst):
        raise AssertionError(f"{dst} was replaced")

    monkeypatch.setattr(deepgap.commands.export.os, "replace", replace)  # the os module's: report's too
    monkeypatch.setattr(deepgap.commands.export.os, "rename", replace)
    s = _store(tmp_path, good)
    for argv in (
        ["export", s, "-o", "/dev/stdout"],
        ["export", s, "-o", "/dev/null"],
        ["report", s, "-o", "/dev/null"],
        RUN + ["--store", "/dev/null"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "system path" in err, err
    assert not os.path.exists("/dev/null-journal")


def test_export_to_stdout(tmp_path, capsys, good):
    assert main(["export", _store(tmp_path, good), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("result_id,") and len(out.splitlines()) > 2
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def _disk_full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_export_onto_a_full_disk_leaves_nothing(tmp_path, capsys, good, monkeypatch):
    """Room for the probe, not for the file: one line, and no half-written or temporary file."""
    import pandas as pd

    monkeypatch.setattr(pd.DataFrame, "to_csv", _disk_full)
    s = _store(tmp_path, good)
    assert main(["export", s, "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left" in err and "nothing was written" in err, err
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_report_onto_a_full_disk_leaves_nothing(tmp_path, capsys, good, monkeypatch):
    import deepgap.report.page

    monkeypatch.setattr(deepgap.report.page, "build", lambda *a, **k: object())
    monkeypatch.setattr(deepgap.report.page, "save", _disk_full)
    s = _store(tmp_path, good)
    assert main(["report", s, "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left" in err and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_huge_batch_leaves_no_run_that_breaks_resume(tmp_path, capsys):
    """The 10^20 batch used to leave a 'running' run whose every --resume crashed: now nothing is stored."""
    store = str(tmp_path / "s.sqlite")
    assert main(RUN[:3] + ["--batch-sizes", "99999999999999999999", "--device", "cpu", "--store", store]) == 2
    assert not os.path.exists(store)
    assert main(["run", "--quiet", "--resume", "--store", store]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_dataset_labels_all_integers_or_all_names(tmp_path):
    from deepgap.measure.accuracy.dataset import load

    assert [lab for _, lab in load(_dataset(tmp_path, ["3", "0", "3"])).items] == [3, 0, 3]
    names = load(_dataset(tmp_path, ["dog", "cat", "dog"]))
    assert names.classes == ("cat", "dog") and [lab for _, lab in names.items] == [1, 0, 1]


def _interrupted_worker(path):
    import sys

    sys.stderr = open(path, "w")  # noqa: SIM115 - what multiprocessing would print goes here
    raise KeyboardInterrupt


def test_ctrl_c_worker_exits_quietly(tmp_path):
    """Ctrl-C reaches the worker too: it must exit with 130 and print nothing (the parent says the line)."""
    import multiprocessing as mp

    from deepgap.drive.handle import _with_environ

    err = str(tmp_path / "worker.err")
    p = mp.get_context("fork").Process(
        target=_with_environ, args=(dict(os.environ), _interrupted_worker, err)
    )
    p.start()
    p.join(HANG_S)
    assert p.exitcode == 130
    assert Path(err).read_text() == ""


def test_ctrl_c_is_one_line(tmp_path, capsys, monkeypatch):
    import deepgap.api

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(deepgap.api, "run", interrupted)
    assert main(RUN + ["--store", str(tmp_path / "s.sqlite")]) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "interrupted" in err
