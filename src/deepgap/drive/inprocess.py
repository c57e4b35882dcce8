"""An in-process launcher for tests: the worker protocol (`WorkerHandle.call`) without a process.

Why: a test of a driver (a run session, a command, a scheduler) wants the real handlers and the
real failure mapping but not the seconds a worker process costs to start. `InProcessWorker` runs the
worker's handlers (`deepgap.measure.worker.resolve`) on one `WorkerState` in this process, and answers
as a worker does: a handler's exception comes back as `WorkerFailed` (status from
`deepgap.measure.worker.failure`). What it cannot give is isolation — a crash or a hang is this
process's — so it is for CPU tests only; real runs use `deepgap.drive.handle.WorkerHandle`. It imports
the worker module by name, as a worker process does (`_worker`): it is a worker in this process, the
one place a parent-side module runs worker code. A serve's worker (`serving.run.process.ServingWorker`)
is launched with `spawn`, the way `WorkerHandle` starts a process: `deepgap.serving.run.process.HANDLE` names
the class that tests swap for this one (tests/conftest.py's `inprocess_serving`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from deepgap.core import progress
from deepgap.core.precision import DeviceCaps
from deepgap.drive.handle import CallProtocol
from deepgap.measure.protocol import WORKER_MAIN, worker_module


def _worker() -> Any:
    """The worker process's module (`deepgap.measure.protocol.WORKER_MAIN`), imported by name."""
    return importlib.import_module(WORKER_MAIN.partition(":")[0])


class InProcessWorker(CallProtocol):
    """Same interface as `deepgap.drive.handle.WorkerHandle` (start, alive, call, send/receive, stop, kill)."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.caps: DeviceCaps | None = None
        self.state: Any = None
        self._reply: tuple[str, Any] | None = None

    def start(self, name: str = "deepgap-inprocess") -> DeviceCaps:
        """Build the worker state here (probes the device in this process: CPU tests only)."""
        self.state = _worker().WorkerState(self.device)
        self.caps = self.state.caps
        return self.caps

    def spawn(
        self, target: str | Callable[..., Any], args: tuple, name: str, timeout_s: float
    ) -> tuple[str, Any]:
        """Start the worker state and answer its first message, as `WorkerHandle.spawn` of the worker main does.

        Only the worker main (`WORKER_MAIN` on this device) runs here: ``("ready", caps)``, or
        ``("failed", (status, reason, traceback))`` when the device cannot be used, as a worker process says.
        """
        if target != WORKER_MAIN or tuple(args) != (self.device,):
            raise ValueError(
                f"an in-process worker runs only {WORKER_MAIN}({self.device!r}), not {target}{args}"
            )
        try:
            return "ready", self.start(name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - answered as the worker process answers
            self.state = None
            return "failed", _worker().failure(exc)

    def alive(self) -> bool:
        """Whether `start` ran and `stop` did not."""
        return self.state is not None

    def send(self, kind: str, payload: Any) -> None:
        """Run the handler now; its answer waits for `receive`."""
        module = worker_module(kind)  # an unknown kind is the caller's error, as with a worker process
        worker = _worker()
        fn = worker.resolve(kind, module)
        if self.state is None:
            self.start()
        try:
            with progress.sink(self.on_progress):  # a handler's progress lines, at once (no pipe between)
                self._reply = ("ok", fn(self.state, payload))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - answered as the worker process answers
            self._reply = ("failed", worker.failure(exc))

    def recv(self, timeout: float) -> tuple[str, Any]:
        """The answer to the request sent last."""
        reply, self._reply = self._reply, None
        assert reply is not None, "nothing was sent"
        return reply

    def stop(self) -> None:
        """Drop the state (its models and caches), as a worker's exit does."""
        self.state = None

    kill = stop
