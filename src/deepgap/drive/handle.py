"""The parent's handle on one worker process: start it clean, send requests, survive its death or hang.

Why apart from the sweep's runner (`deepgap.drive.runner`): every launcher talks to its worker through
this handle — the sweep's `SweepRunner`, the serving worker (`serving.run.process.ServingWorker`), the
fleets' lanes — and only the handle knows processes: a fork server with torch preloaded (never a CUDA
context), the parent's environment of the moment, the request protocol (`CallProtocol.call`: send the
kind, its worker module and the payload, then wait for the answer at most ``timeout`` seconds), and a
crash or a hang turned into `WorkerLost` with the status to store.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from deepgap.core import progress
from deepgap.core.errors import UsageError
from deepgap.core.precision import DeviceCaps
from deepgap.core.records import Status
from deepgap.measure.protocol import WORKER_MAIN, worker_module

START_TIMEOUT_S = 300.0  # a worker's start (and fingerprint): the fork server imports torch first

# Imported once by the fork server, so a worker starts without importing torch (seconds on a small CPU);
# torch._dynamo is imported lazily by the first torch call that any worker makes. None of these creates a
# CUDA context or even counts devices on import (tests/drive/test_runner.py checks), so each forked worker makes
# its own context; had the server made one, torch would refuse CUDA in the child, loudly.
# scipy.stats (the bootstrap CIs and the serving verdicts) is imported on first use since the CLI stopped
# paying 1.5 s for it at every start; preloaded here, a worker never pays it inside a timed-out request.
# deepgap.drive.forkserver_quiet comes first: the server and its workers ignore Ctrl-C from then on.
_PRELOAD = ["deepgap.drive.forkserver_quiet", "torch", "torchvision", "torch._dynamo", "scipy.stats"]


def _preload() -> list[str]:
    """The fork server's preload: `_PRELOAD`, or the modules of ``DEEPGAP_WORKER_PRELOAD`` (comma-separated).

    Why a knob: the server imports the list once, whether or not a worker will use it, and torchvision is
    about a third of its cost (some 7 CPU-s on a loaded 2-core host): a worker that builds no torchvision
    model (tinycnn) never imports it. A host that starts a fresh server per job (each Ray job's workers,
    the tests' Ray cluster) can name only what its workers need; a module left out is imported by the
    worker that needs it, on first use. Ctrl-C's module stays first.
    """
    named = os.environ.get("DEEPGAP_WORKER_PRELOAD")
    if named is None:
        return list(_PRELOAD)
    return [_PRELOAD[0], *(m.strip() for m in named.split(",") if m.strip() and m.strip() != _PRELOAD[0])]


def _context() -> Any:
    """The ``forkserver`` context with torch preloaded (``spawn`` where there is no fork server)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preload())
    return ctx


@contextlib.contextmanager
def _ctrl_c_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile: a process started now is born with it blocked.

    Why: Ctrl-C reaches every process of the terminal's group. A fork server importing torch, or a
    worker unpickling its target (importing deepgap and scipy), met it mid-import: each printed a
    traceback (one a broken numpy's AttributeError) over the parent's one line, and the parent, stopped
    inside ``Process.start``, failed again joining a process that never started (issue 46). The child
    keeps the mask across exec, so a Ctrl-C that reaches it stays pending until it ignores SIGINT
    (`deepgap.drive.forkserver_quiet`, the fork server's first import; `_with_environ` for a spawned
    worker), which discards it. The parent's own handling is left alone: it never ignores SIGINT (that
    disposition is the whole process's, and a Ctrl-C delivered to another of its threads meanwhile was
    dropped: the run finished with 0), and a Ctrl-C that arrives while this thread blocks it is handled
    by another thread's handler or stays pending until the mask is restored; Linux never drops it.
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _start(proc: Any, ctx: Any) -> None:
    """``proc.start()``, its process (and the fork server it comes from) deaf to Ctrl-C (`_ctrl_c_blocked`).

    The fork server is started first, briefly blocked; the start itself (which waits for the server's
    imports the first time, seconds) is left open to Ctrl-C: the worker is forked by the server.
    """
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver, resource_tracker

        # the server starts the resource tracker first, unless it runs: starting it unblocks SIGINT here
        resource_tracker.ensure_running()
        with _ctrl_c_blocked():
            forkserver.ensure_running()
        proc.start()
        return
    with _ctrl_c_blocked():
        proc.start()


def _stop_fork_server() -> None:
    """Kill this process's fork server, if it runs: the run was stopped while a worker started.

    Why: the server ignores Ctrl-C and, started moments ago, imports torch for seconds more (tens of CPU
    seconds on a loaded host) before it would notice that its parent is gone; nothing needs it now. A
    worker it already forked is not its child's business: the parent stops each (`WorkerHandle.stop`).
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver  # noqa: SLF001 - the stdlib's one server; it has no public stop
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):  # closes its pipe, reaps it, removes its socket
        server._stop()  # noqa: SLF001


def _with_environ(environ: dict[str, str], target: str | Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` under the parent's environment of the moment.

    A worker's target is named (``module:function``), not passed: the parent never imports a worker module
    (`deepgap.measure.protocol`), so the child imports it here. A callable target (a test's, a benchmark's
    bare loop) runs as given.

    A fork server keeps the environment it started with; the worker must see the parent's as it is now
    (``DEEPGAP_CACHE``, ``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``), as a spawned one would.

    Ctrl-C reaches every process of the terminal's group, but a worker ignores SIGINT: the parent stops
    it. A forked worker is born ignoring it (`deepgap.drive.forkserver_quiet`); a spawned one was born
    with it blocked (`_ctrl_c_blocked`) and ignores it here, before it imports its target. SIGTERM and
    SIGHUP end the worker at once and quietly (code 130), so the user sees the parent's one line, not the
    worker's traceback; a parent that is gone (a broken pipe) ends the worker quietly.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # discards a Ctrl-C left pending by the blocked start
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.clear()
    os.environ.update(environ)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # kill, systemd, docker stop, a closed terminal: as Ctrl-C
        signal.signal(sig, signal.default_int_handler)
    try:
        if isinstance(target, str):
            module, _, name = target.partition(":")
            target = getattr(importlib.import_module(module), name)
        return target(*args)
    except KeyboardInterrupt:
        os._exit(130)
    except BrokenPipeError:  # the parent went away: nobody to answer, nothing to print
        os._exit(0)


class WorkerLost(Exception):
    """The worker died or hung; ``status`` says which."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class WorkerFailed(Exception):  # noqa: N818 - named as its sibling WorkerLost
    """The worker answered, but its handler raised: ``status`` (oom, error, skipped…), reason, traceback."""

    def __init__(self, status: Status, reason: str, traceback: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.traceback = traceback


class CallProtocol:
    """``call`` = ``send`` then ``receive``: shared by the worker process's handle and the in-process one.

    ``on_progress``: what a handler's progress lines are passed to (`deepgap.core.progress`; stderr by default).
    """

    on_progress: Callable[[str], None] = staticmethod(progress.show)

    def send(self, kind: str, payload: Any) -> None:  # pragma: no cover - each launcher defines it
        """Hand request ``kind`` with ``payload`` to the worker."""
        raise NotImplementedError

    def recv(self, timeout: float) -> tuple[str, Any]:  # pragma: no cover - each launcher defines it
        """The next (kind, payload) reply."""
        raise NotImplementedError

    def receive(self, timeout: float) -> Any:
        """The reply to the request sent last: `WorkerFailed` if its handler raised, `WorkerLost` if none."""
        kind, payload = self.recv(timeout)
        if kind == "failed":
            raise WorkerFailed(*payload)
        return payload

    def call(self, kind: str, payload: Any, timeout: float) -> Any:
        """Run the handler of ``kind`` (its worker module: `deepgap.measure.protocol`) on ``payload``.

        Waits at most ``timeout`` seconds for the answer.
        """
        self.send(kind, payload)
        return self.receive(timeout)


class WorkerHandle(CallProtocol):
    """One worker process, forked from a clean fork server: it never inherits a CUDA context."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.proc: Any = None
        self.conn: Any = None
        self.caps: DeviceCaps | None = None
        self.busy = False  # a request sent and not answered: the worker reads nothing else meanwhile

    def spawn(
        self, target: str | Callable[..., Any], args: tuple, name: str, timeout_s: float
    ) -> tuple[str, Any]:
        """Start ``target(child_conn, *args)`` (``module:function``) and return its first message."""
        ctx = _context()
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_with_environ, args=(dict(os.environ), target, child, *args), daemon=True, name=name
        )
        try:
            _start(self.proc, ctx)
        except BaseException as exc:  # Ctrl-C midway: a process that never started has nothing to join
            if getattr(self.proc, "_popen", None) is None:
                self.proc = None
                if isinstance(exc, KeyboardInterrupt):
                    _stop_fork_server()
            parent.close()
            child.close()
            raise
        child.close()  # so a dead child gives EOF instead of a hang
        self.conn = parent
        return self.recv(timeout_s)

    def start(self, name: str = "deepgap-worker") -> DeviceCaps:
        """Start the process and wait until it has probed the device."""
        kind, payload = self.spawn(WORKER_MAIN, (self.device,), name, START_TIMEOUT_S)
        if kind != "ready":
            self.stop()
            why = payload[1] if isinstance(payload, tuple) else payload
            raise UsageError(f"the worker could not use device {self.device}: {why}", "check `deepgap env`")
        self.caps = payload
        return payload

    def recv(self, timeout: float) -> tuple[str, Any]:
        """The worker's next answer; `WorkerLost` (and the process killed) after ``timeout`` s or a crash.

        Progress lines the handler says meanwhile (`deepgap.core.progress`) go to ``on_progress`` as they come;
        they do not extend ``timeout``, which bounds the whole wait.
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    self.kill()
                    raise WorkerLost(
                        Status.TIMEOUT, f"worker gave no answer within {timeout:.0f} s and was killed"
                    )
                reply = self.conn.recv()
                if reply[0] != "progress":
                    self.busy = False
                    return reply
                self.on_progress(reply[1])
        except (EOFError, ConnectionError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            if code is not None and code < 0:
                try:
                    why = f"killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    why = f"killed by signal {-code}"
            else:
                why = f"exit code {code}"
            self.kill()
            raise WorkerLost(Status.CRASH, f"worker process died ({why})") from None

    def send(self, kind: str, payload: Any) -> None:
        """Send one request without waiting (tenants start their levels together, then `receive`)."""
        module = worker_module(kind)  # an unknown kind is the caller's error, not a lost worker
        try:
            self.conn.send((kind, module, payload))
            self.busy = True
        except (BrokenPipeError, OSError, AttributeError):  # AttributeError: no pipe, never started
            self.kill()
            raise WorkerLost(Status.CRASH, "worker process was gone before the request") from None

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.is_alive()

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not (at once while it is busy: a run was stopped).

        A worker in the middle of a request reads the exit request only after it (minutes, at worst the
        timeout): when the parent stops waiting for an answer (Ctrl-C, SIGTERM), the worker is killed.
        """
        if self.proc is None:
            return
        if self.busy:
            self.kill()
            return
        try:
            if self.conn is not None:  # None when the process never got going
                self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(10)
        self.kill()

    def kill(self) -> None:
        """Kill the process now."""
        self.busy = False
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None
