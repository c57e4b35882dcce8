"""Call the ``deepgap`` CLI in this process, with the result shaped like ``subprocess.run``'s.

Why: a fresh ``python -m deepgap`` imports torch again (seconds on two cores) only to print one error
line or read a store. Tests that check what the CLI prints and returns use :func:`deepgap_cli`; tests
whose point is process isolation (a crash, a hang, SIGKILL, resume after a kill, Ray node loss, serving
tenants) keep real subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

from deepgap.cli import main

# `deepgap serve` at its smallest on the CPU (tinycnn, one thread, three batches, a 0.2 s floor): the
# serving tests' common arguments, each test adding its scenario and store.
SERVE_SMALL = (
    "--model",
    "tinycnn",
    "--engine",
    "eager",
    "--precision",
    "fp32",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--batch-sizes",
    "1,2,4",
    "--curve-iterations",
    "5",
    "--min-queries",
    "64",
    "--min-duration",
    "0.2s",
)
# a decoder's serve at its smallest (llama-tiny, one thread, 20 requests a level), each test adding its slots
SERVE_TINY_DECODER = (
    *("--model", "llama-tiny", "--device", "cpu", "--threads", "1", "--qps", "50", "--curve-iterations", "3"),
    *("--input-len-dist", "uniform:4:16", "--output-len-dist", "fixed:4", "--min-queries", "20"),
    *("--max-queries", "20", "--min-duration", "0.05s", "--no-telemetry"),
)


def deepgap_cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``deepgap ARGS`` through :func:`deepgap.cli.main`: exit code (argparse's ``SystemExit`` too),
    stdout and stderr, as ``subprocess.run(..., capture_output=True, text=True)`` would give them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors, and commands that exit themselves
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=err)
    return subprocess.CompletedProcess(["deepgap", *args], int(code or 0), out.getvalue(), err.getvalue())


# what a tinycnn worker needs, imported once by a run's fork server (no torchvision: ~3 CPU-s less)
TINY_PRELOAD = "torch,torch._dynamo,scipy.stats"


def deepgap_process(*args: str, **popen) -> subprocess.Popen:
    """``python -m deepgap ARGS`` as a real process in a session of its own, for tests whose point is the process
    (a signal, a kill, a resume after it); its fork server preloads `TINY_PRELOAD`. ``popen``: more of
    ``subprocess.Popen``'s keywords (``stderr``, ``text``)."""
    env = {**os.environ, "DEEPGAP_WORKER_PRELOAD": TINY_PRELOAD}
    return subprocess.Popen(
        [sys.executable, "-m", "deepgap", *args], start_new_session=True, env=env, **popen
    )
