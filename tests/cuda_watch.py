"""Preloaded by tests/drive/test_runner.py's fork server first: records every call into torch's CUDA entry points.

`deepgap.drive.handle._PRELOAD` must never initialise CUDA or count devices (a CUDA driver initialised
before fork() fails in every child). The fork server imports this module right after Ctrl-C's
(`deepgap.drive.forkserver_quiet`, imported again here under the watch), then the rest of the preload;
a worker forked from it inherits `CALLS` and `PID` (the server's: a worker that had to import this module
itself would show its own pid).
"""

from __future__ import annotations

import importlib
import os

import torch

PID = os.getpid()
CALLS: list[str] = []
for _name in ("_cuda_getDeviceCount", "_cuda_init", "_cuda_isDriverSufficient"):
    _f = getattr(torch._C, _name, None)
    if _f is not None:
        setattr(torch._C, _name, lambda *a, _f=_f, _n=_name: CALLS.append(_n) or _f(*a))

import deepgap.drive.forkserver_quiet  # noqa: E402 - watched: imported before this module by the server

importlib.reload(deepgap.drive.forkserver_quiet)
