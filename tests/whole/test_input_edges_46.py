"""Issue 46's hostile inputs: each one line and exit 2, nothing created, nothing started, nothing opened.

Before: ``monitor --interval 1e300`` overflowed and ``nan`` was accepted; ``--device=a:b:c`` and
``capacity --seed=-5`` were ValueErrors; ``capacity --min-duration 1e20`` never ended; ``serve --qps 1e6
--min-duration 86400s`` (each within its range) tried to allocate 644 GiB; ``--trace /proc/self/status``
and a dataset row naming a ``/proc`` file were opened; dataset labels ``²`` were a ValueError and a
label of 10^12 built 10^12 class names; ``check`` called a newer store DAMAGED where every other
command says "upgrade deepgap"; a host named ``cpu`` made ``merge --redact`` token every device ``cpu``.
"""

from __future__ import annotations

import os
import sqlite3

import pytest
from test_input_edges import RUN, SERVE, _dataset, _new, _store, _trace, good, no_runner_no_hang  # noqa: F401

from deepgap.cli import main

SLO = ["--slo-p99", "15ms"]
CASES = [
    ("monitor interval 1e300", lambda t, g: ["monitor", "--interval", "1e300", "--count", "1"], "--interval"),
    ("monitor interval nan", lambda t, g: ["monitor", "--interval", "nan", "--count", "1"], "--interval"),
    ("monitor device a:b:c", lambda t, g: ["monitor", "--device=a:b:c", "--count", "1"], "not a device"),
    ("capacity seed -5", lambda t, g: ["capacity", _store(t, g), *SLO, "--seed=-5"], "--seed"),
    (
        "capacity min-duration 1e20",
        lambda t, g: ["capacity", _store(t, g), *SLO, "--min-duration", "1e20"],
        "is over a day",
    ),
    (
        "plan seed -5",
        lambda t, g: ["plan", _store(t, g), *SLO, "--qps", "10", "--model", "resnet18", "--seed=-5"],
        "--seed",
    ),
    (
        "serve qps 1e6 for a day",
        lambda t, g: [*SERVE, "--qps", "1e6", "--min-duration", "86400s", *_new(t)],
        "fit in memory",
    ),
    (
        "serve loadgen for 1e30 s",  # no range: the worker's wait overflowed (a traceback)
        lambda t, g: [*SERVE, "--qps", "50", "--loadgen", "--loadgen-duration", "1e30s", *_new(t)],
        "--loadgen-duration must be",
    ),
    ("trace in /proc", lambda t, g: [*SERVE, "--trace", "/proc/self/status", *_new(t)], "system path"),
    ("dataset in /proc", lambda t, g: [*RUN, "--dataset", "/proc/self/status", *_new(t)], "system path"),
    (
        "dataset row in /proc",
        lambda t, g: [*RUN, "--dataset", _rows(t, "/proc/self/status,0\n"), *_new(t)],
        "system path",
    ),
    (
        "dataset label 10^12",
        lambda t, g: [*RUN, "--dataset", _dataset(t, ["0", "10" * 6]), *_new(t)],
        "beyond",
    ),
    ("weights in /proc", lambda t, g: [*RUN, "--weights", "/proc/self/status", *_new(t)], "system path"),
    ("check newer schema", lambda t, g: ["check", _newer(t, g)], "upgrade deepgap"),
]


def _rows(t, text):
    (t / "rows.csv").write_text(text)
    return str(t / "rows.csv")


def _newer(t, g):
    from deepgap.store.migrations import SCHEMA_VERSION

    path = _store(t, g)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.execute("UPDATE runs SET deepgap_version = '99.0'")  # a newer deepgap wrote it, not a damaged header
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("argv_fn, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input(tmp_path, capsys, good, argv_fn, words):  # noqa: F811
    argv = argv_fn(tmp_path, good)
    before = sorted(os.listdir(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("deepgap: error: "), err
    assert words.lower() in err.lower(), err
    assert sorted(os.listdir(tmp_path)) == before


def test_superscript_labels_are_names_not_a_traceback(tmp_path):
    from deepgap.measure.accuracy.dataset import load

    ds = load(_dataset(tmp_path, ["²", "³", "²"]))
    assert ds.classes == ("²", "³") and [lab for _, lab in ds.items] == [0, 1, 0]


def test_a_host_named_cpu_leaves_device_values_alone(tmp_path, good):  # noqa: F811
    s = _store(tmp_path, good)
    con = sqlite3.connect(s)
    con.execute("UPDATE runs SET host = 'cpu', env_json = json_set(env_json, '$.host', 'cpu')")
    con.commit()
    con.close()
    out = str(tmp_path / "m.sqlite")
    assert main(["merge", s, "-o", out, "--redact"]) == 0
    con = sqlite3.connect(out)
    devices = {d for (d,) in con.execute("SELECT DISTINCT device FROM results")}
    hosts = {h for (h,) in con.execute("SELECT json_extract(env_json, '$.host') FROM runs")}
    con.close()
    assert devices == {"cpu"} and all(h.startswith("redacted-") for h in hosts), (devices, hosts)
