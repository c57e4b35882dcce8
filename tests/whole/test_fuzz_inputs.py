"""Fuzzing every command's flags and every TOML key with hostile values (issue 39).

What must hold for any input: no traceback, no hang past a bound, and on exit 2 one line and no file
left behind. An input that passes validation stops where the work would start (a worker process, a
report build): that counts as accepted, so no real sweep or server ever runs here (`test_fuzz_deep`
takes the same flags and values on into a tiny run, report, merge and serve). The flags come from
the parser, so a new flag is fuzzed without touching this file.

Which pairs: a few each run, seeded by the date (issue 46: a fixed draw tried the same 60 pairs of
3,000 every day, so 8 failures a full sweep found were never drawn). The seed is `fuzz_seed.SEED` (printed on
a failure; ``DEEPGAP_FUZZ_SEED=N`` repeats a day). ``DEEPGAP_FUZZ_FULL=1`` tries every flag with every
hostile value (`test_every_flag_with_every_value`, minutes): the nightly-style sweep. A failure either
finds becomes a fixed example in a test of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from fixtures_store import build_store
from fuzz_seed import FULL, SEED
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from deepgap.cli import build_parser, main

HOSTILE = [
    "inf",
    "-inf",
    "nan",
    "1e-300",
    "1e300",
    "99999999999999999999",
    "-5",
    "0",
    "",
    ",",
    "x",
    "1,,2",
    "0.5",
    "-",
    "/dev/null",
    "fifo",
    os.fsdecode(b"bad\xff"),
    "9" * 400,
    "1e-3%",
    "300%",
    "a:b:c",
    "/proc/self/status",  # issue 46: a system file to read
    "1e20",
    "²",
    "a\nb",
    "\x1b[2J",
    "86400s",
]
HANG_S = 60  # a hang, not a slow first import of torch on a loaded machine
# not fuzzed: network (Ray), a browser, folders written on purpose, test-only flags, and monitor's
# --count, whose 0 means "until Ctrl-C" (a valid input that runs forever)
SKIP = {
    "--ray",
    "--where",
    "--devices",
    "--screenshot",
    "--trace-dir",
    "--recover",
    "--backend",
    "monitor --count",
}
NEW = "NEW"  # replaced by a path in the example's folder


def _base(cmd: str) -> list[str]:
    """A valid command line (store paths filled in per example) that one hostile flag then spoils."""
    store = ["STORE"]
    return {
        "run": [
            "run",
            "--models",
            "tinycnn",
            "--batch-sizes",
            "1",
            "--device",
            "cpu",
            "--quiet",
            "--store",
            NEW,
        ],
        "serve": ["serve", "--model", "tinycnn", "--device", "cpu", "--qps", "10", "--quiet", "--store", NEW],
        "export": ["export", *store, "-o", "OUT"],
        "report": ["report", *store, "-o", "OUT"],
        "merge": ["merge", *store, "-o", "OUT"],
        "check": ["check", *store],
        "monitor": ["monitor", "--backend", "fake:throttle", "--count", "1", "--interval", "0.01", "--plain"],
        "peaks": ["peaks", "--device", "cpu", "--store", NEW],
        "profile": ["profile", "--device", "cpu", "--store", NEW],
        "env": ["env", "--device", "cpu"],
        "list": ["list", "models"],
    }.get(cmd, [cmd, *store])


def _flags() -> list[tuple[str, str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(
        (name, a.option_strings[-1])
        for name, sp in sub.choices.items()
        for a in sp._actions
        if a.option_strings
        and a.nargs != 0
        and not isinstance(a, argparse._HelpAction)
        and a.option_strings[-1] not in SKIP
        and f"{name} {a.option_strings[-1]}" not in SKIP
    )


FLAGS = _flags()


class Reached(Exception):  # noqa: N818 - not an error: the input was accepted
    """Valid input: the command got as far as starting the real work."""


def _reached(*a, **k):
    raise Reached


_STORE: list[bytes] = []


def _store_bytes() -> bytes:
    """A small valid store, built once (not a fixture: hypothesis would print its bytes on a failure)."""
    if not _STORE:
        folder = Path(tempfile.mkdtemp(prefix="deepgap-fuzz-store-"))
        build_store(str(folder / "s.sqlite"), gpu=False)
        import deepgap.measure.models  # noqa: F401  (torch: imported once here, not inside an example's time bound)

        _STORE.append((folder / "s.sqlite").read_bytes())
        shutil.rmtree(folder)
    return _STORE[0]


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Where the work starts, stop: worker processes, report builds, Chromium."""
    import deepgap.drive.handle
    import deepgap.report.page

    monkeypatch.setattr(deepgap.drive.handle.WorkerHandle, "spawn", _reached)
    monkeypatch.setattr(deepgap.report.page, "write_report", _reached)

    def hung(*_):
        raise AssertionError(f"still running after {HANG_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _check(argv: list[str], capsys) -> None:
    """Run ``argv`` in a fresh folder: accepted, or one line with exit 2 and the folder as it was.

    ``monitor`` exits 1 with one line where no telemetry can be read (no GPU, no backend): not bad input.
    """
    store_bytes = _store_bytes()
    folder = Path(tempfile.mkdtemp(prefix="deepgap-fuzz-"))
    try:
        (folder / "s.sqlite").write_bytes(store_bytes)
        os.mkfifo(folder / "fifo")
        subst = {
            "STORE": str(folder / "s.sqlite"),
            NEW: str(folder / "new.sqlite"),
            "OUT": str(folder / "out.x"),
            "fifo": str(folder / "fifo"),
        }
        argv = [subst.get(a, a) for a in argv]
        before = sorted(os.listdir(folder))
        cwd = os.getcwd()
        os.chdir(folder)  # a relative output path lands in the example's folder, never in the checkout
        signal.alarm(HANG_S)
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        except Reached:
            return
        finally:
            signal.alarm(0)
            os.chdir(cwd)
            err = capsys.readouterr().err.strip()
        assert code in (0, 2) or (argv[0] == "monitor" and code == 1), (argv, code, err)
        if code:
            assert len(err.splitlines()) == 1 and err.startswith("deepgap"), (argv, err)
            assert sorted(os.listdir(folder)) == before, argv
            assert (folder / "s.sqlite").read_bytes() == store_bytes, argv
    finally:
        shutil.rmtree(folder, ignore_errors=True)


FUZZ = settings(
    max_examples=60,
    derandomize=False,  # rotated by `SEED`
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@seed(SEED)
@FUZZ
@given(flag=st.sampled_from(FLAGS), value=st.sampled_from(HOSTILE))
def test_every_flag(flag, value, capsys):
    cmd, option = flag
    _check(_base(cmd) + [f"{option}={value}"], capsys)


# The full sweep exists only when asked for (DEEPGAP_FUZZ_FULL=1): collected then, absent otherwise, so CI
# neither runs its minutes nor reports a skip that needs no GPU.
if FULL:

    def test_every_flag_with_every_value(capsys):
        """Every flag of every command against every hostile value; all failures listed at the end."""
        failures = []
        for cmd, option in FLAGS:
            for value in HOSTILE:
                try:
                    _check(_base(cmd) + [f"{option}={value}"], capsys)
                except AssertionError as exc:
                    failures.append(f"{cmd} {option}={value!r}: {str(exc).splitlines()[0][:300]}")
        assert not failures, f"{len(failures)} of {len(FLAGS) * len(HOSTILE)} pairs:\n" + "\n".join(failures)


TOML_VALUES = [
    "5",
    '"abc"',
    "[1]",
    '["x"]',
    "inf",
    "nan",
    "-1",
    "1e300",
    "true",
    "{a = 1}",
    "[]",
    "9223372036854775808",
    '"1%"',
    "0",
]


def _keys() -> list[str]:
    import dataclasses

    from deepgap.drive.config import SweepSpec

    return sorted(f.name for f in dataclasses.fields(SweepSpec)) + ["preset", "sweep", "nosuchkey"]


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=st.sampled_from(_keys()), value=st.sampled_from(TOML_VALUES))
def test_every_toml_key(key, value, capsys):
    folder = Path(tempfile.mkdtemp(prefix="deepgap-fuzz-toml-"))
    try:
        (folder / "sweep.toml").write_text(f'models = ["tinycnn"]\ndevice = "cpu"\n{key} = {value}\n')
        _check(["run", "--config", str(folder / "sweep.toml"), "--quiet", "--store", NEW], capsys)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("path", ["fifo", "/dev/null", os.fsdecode(b"bad\xff.sqlite"), "x" * 5000, "-"])
@pytest.mark.parametrize("cmd", ["show", "export", "report", "merge", "compare"])
def test_store_paths(cmd, path, capsys):
    argv = [subst if subst != "STORE" else path for subst in _base(cmd)]
    _check(argv, capsys)
