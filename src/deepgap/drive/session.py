"""One run session for every kind of run: open → prelude → record → finish.

Why one: ``run``, a fleet sweep, ``serve``, ``profile`` and ``peaks`` each store a run row, results
that belong to it, and a final status. They used to do so each in their own way, and only ``run``
measured the idle baseline and the thermal warm-up. A `RunSession` is the one place that does:

- `RunSession.open` creates the run row (`Store.begin_run`; the run's ``kind`` is passed there and
  nowhere else), `RunSession.resume` re-opens an unfinished one;
- `RunSession.prelude` measures the run-level telemetry on each device of the run's `Launcher`
  (`deepgap.drive.prelude`): the idle baseline, and the thermal warm-up when asked;
- `RunSession.record` stores one result; `RunSession.finish` marks the run finished or interrupted.

Used as a context manager it finishes the run ``interrupted`` when the body raises (a run left so is
what ``--resume`` continues) and closes the store, removing a file it created if no run was stored.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepgap.core.errors import UsageError
from deepgap.core.limits import check_device
from deepgap.core.records import ConfigSpec, Result
from deepgap.core.version import __version__
from deepgap.drive.config import SweepSpec
from deepgap.drive.presets import default_spec, preset
from deepgap.store import RESUMABLE, RUN_KINDS, Store, check_path

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.drive.launcher import Device, Launcher

# The kinds of run a store holds, by name; resume picks up its own kind only.
SWEEP, FLEET, SERVE, PROFILE, PEAKS = RUN_KINDS


@dataclass
class Results:
    """What a sweep returns: the run's id, its store, and the results measured in this call."""

    run_id: str
    store_path: str
    results: list[Result] = field(default_factory=list)

    def to_pandas(self) -> pd.DataFrame:
        """Every stored result of this run (including earlier, resumed parts) as a DataFrame."""
        store = Store(self.store_path, readonly=True)
        try:
            return store.results_frame([self.run_id])
        finally:
            store.close()


def visible_cuda_count() -> int:
    """How many CUDA devices torch sees (no CUDA context is created in this process)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def gpu_present() -> bool:
    """Whether torch sees a CUDA device."""
    return visible_cuda_count() > 0


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is present else ``cpu``; a clear error for an absent GPU or a bad name."""
    check_device(device)
    if device == "auto":
        return "cuda" if gpu_present() else "cpu"
    if device.startswith("cuda"):
        n = visible_cuda_count()
        if not n:
            raise UsageError(
                f"--device {device} but no CUDA GPU is usable here", "use --device cpu (or auto)"
            )
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= n:
            raise UsageError(
                f"--device {device} but only {n} GPU(s) are visible", f"use cuda:0..cuda:{n - 1}"
            )
    return device


def as_spec(spec: SweepSpec | dict[str, Any] | str | None) -> SweepSpec:
    """Accept a SweepSpec, a dict of overrides, a preset name, or None (the device's default)."""
    if spec is None:
        return default_spec(gpu_present(), os.cpu_count() or 1)
    if isinstance(spec, str):
        return preset(spec)
    if isinstance(spec, dict):
        return SweepSpec.from_dict(spec)
    return spec


def open_resume(store: str, resume: str | bool) -> tuple[Store, dict[str, Any]]:
    """The store (open) and the run ``resume`` names (True: the latest unfinished one), or a `UsageError`."""
    check_path(store)
    if not os.path.exists(store):
        raise UsageError(f"--resume but store {store} does not exist", "drop --resume or pass --store")
    s = Store(store)
    try:
        row = s.latest_unfinished() if resume is True else s.run(str(resume))
    except BaseException:  # no such run: the store (and its lock file) closed, nothing left behind
        s.close()
        raise
    if row is None:
        s.close()
        raise UsageError(f"store {store} has no unfinished run to resume", "start a new run without --resume")
    if row.get("kind", SWEEP) not in RESUMABLE:
        s.close()
        raise UsageError(
            f"run {row['run_id']} is a {row['kind']} run; --resume continues sweeps only",
            "run that command again instead",
        )
    if (owner := live_owner(row)) is not None:
        s.close()
        raise UsageError(
            f"run {row['run_id']} is still being measured by deepgap process {owner} on this host",
            f"wait for it to finish, or stop it (kill {owner}) and resume then",
        )
    return s, row


def live_owner(row: dict[str, Any]) -> int | None:
    """The pid of the live deepgap process on this host that is measuring run ``row``, else None.

    Why: ``--resume`` took over a run another process was still measuring; both then measured the same
    configurations, both said they stored them, and the store kept one process's rows (the other's were
    ignored as duplicates). A process of another command that reuses a dead owner's pid is not an owner.
    """
    import socket

    import psutil

    pid = row.get("pid")
    if row.get("status") != "running" or not pid or row.get("host") != socket.gethostname():
        return None
    if int(pid) == os.getpid():
        return None
    try:
        cmd = " ".join(psutil.Process(int(pid)).cmdline())
    except (psutil.Error, ValueError, OSError):
        return None
    return int(pid) if "deepgap" in cmd else None


class RunSession:
    """The store side of one run of any kind (see the module docstring)."""

    def __init__(self, path: str, kind: str = SWEEP, store: Store | None = None) -> None:
        self.path = path
        self.kind = kind
        self.store = store  # opened by `open` when not given (so bad input writes nothing before)
        self.run_id: str | None = None
        self.status: str | None = None  # set by `finish`

    def open(
        self, spec: dict[str, Any], command: str, env: dict[str, Any], version: str = __version__
    ) -> str:
        """Create the run row (by deepgap ``version``); returns its id."""
        if self.store is None:
            self.store = Store(self.path)
        self.run_id = self.store.begin_run(spec, command, env, version, kind=self.kind)  # the one place
        return self.run_id

    def resume(self, run_id: str) -> str:
        """Continue the unfinished run ``run_id`` (marked running again, owned by this process)."""
        if self.store is None:
            self.store = Store(self.path)
        self.store.reopen_run(run_id)
        self.run_id = run_id
        return run_id

    def prelude(
        self,
        launcher: Launcher,
        sweep: SweepSpec,
        configs: Sequence[ConfigSpec],
        log: Callable[[str], None] = lambda m: None,
    ) -> dict[str, dict[str, Any]]:
        """Idle baseline and thermal warm-up on each of ``launcher``'s devices, stored as run-level telemetry.

        ``configs``: what the run will measure; the warm-up loads each device with the first one's group
        (no configurations: the idle baseline only). A device measured in this thread writes its rows
        at once; one measured in a thread of its own (a fleet's lanes, all at once) keeps them in
        `deepgap.drive.prelude.HeldRows` until this thread writes them: the store's connection is this
        thread's. Returns each lane's summaries (``""`` on one device).
        """
        from deepgap.drive import prelude

        assert self.store is not None and self.run_id is not None, "open the session first"
        store, run_id, owner = self.store, self.run_id, threading.get_ident()
        held: list[prelude.HeldRows] = []
        out: dict[str, dict[str, Any]] = {}

        def measure(lane: str, device: Device, on: Sequence[ConfigSpec]) -> None:
            sink: prelude.TelemetrySink = store
            if threading.get_ident() != owner:
                sink = prelude.HeldRows()
                held.append(sink)
            say = (lambda m: log(f"{lane}: {m}")) if lane else log
            out[lane] = prelude.run_level(device, sink, run_id, sweep, on, say)

        try:
            launcher.prelude(measure, configs)
        finally:
            for rows in held:
                rows.write(store)
        return out

    def record(self, result: Result) -> int | None:
        """Store one finished configuration (and its telemetry) in its own transaction."""
        assert self.store is not None and self.run_id is not None, "open the session first"
        return self.store.record(self.run_id, result, telemetry=result.telemetry)

    def finish(self, status: str = "finished") -> None:
        """Mark the run ``finished`` (or ``interrupted``); nothing if it was never opened."""
        if self.store is not None and self.run_id is not None:
            self.store.finish_run(self.run_id, status)
            self.status = status

    def close(self, discard_empty: bool = True) -> None:
        """Close the store (removing a file this session created if no run was stored)."""
        if self.store is not None:
            self.store.close(discard_empty=discard_empty)
            self.store = None

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self.status is None:  # a status the body set itself stands
                self.finish("interrupted" if exc_type is not None else "finished")
        finally:
            self.close()
