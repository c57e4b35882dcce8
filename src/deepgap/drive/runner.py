"""The parent side of a sweep: plans, hands configurations to a worker, survives its failures, stores.

The parent never imports a model or touches the GPU: a crash, a hang (killed after ``timeout_s``),
a sticky CUDA error or an OOM in the worker costs that configuration only. After an OOM the larger
batches of the same group are stored as skipped, with the reason (never silently dropped, never
silently shrunk as timm's script does).

`SweepRunner` is the one-device `deepgap.drive.launcher.Launcher` (and the prelude's `Device`): the one
driver (`deepgap.drive.loop.drive`) starts it, asks its fingerprint, hands it to the run session for the
prelude, and pulls `Started`/`Finished` items from `SweepRunner.results`.
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.precision import DeviceCaps
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.drive.config import SweepSpec
from deepgap.drive.launcher import Finished, PreludeMeasure, Started
from deepgap.measure.protocol import WORKER_MAIN, MeasureRequest, worker_module
from deepgap.measure.telemetry.settings import TelemetrySettings, settings_for
from deepgap.measure.timing import TimingProtocol

_START_TIMEOUT_S = 300.0
# Imported once by the fork server, so a worker starts without importing torch (seconds on a small CPU);
# torch._dynamo is imported lazily by the first torch call that any worker makes. None of these creates a
# CUDA context or even counts devices on import (tests/test_runner.py checks), so each forked worker makes
# its own context; had the server made one, torch would refuse CUDA in the child, loudly.
_PRELOAD = ["torch", "torchvision", "torch._dynamo"]


def _context() -> Any:
    """The ``forkserver`` context with torch preloaded (``spawn`` where there is no fork server)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _with_environ(environ: dict[str, str], target: str | Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` under the parent's environment of the moment.

    A worker's target is named (``module:function``), not passed: the parent never imports a worker module
    (`deepgap.measure.protocol`), so the child imports it here. A callable target (a test's, a benchmark's
    bare loop) runs as given.

    A fork server keeps the environment it started with; the worker must see the parent's as it is now
    (``DEEPGAP_CACHE``, ``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``), as a spawned one would.

    Ctrl-C reaches every process of the terminal's group, the worker too: it exits at once and
    quietly (code 130), so the user sees the parent's one line, not the worker's traceback SIGTERM and
    SIGHUP are handled alike, and a parent that is gone (a broken pipe) ends the worker quietly.
    """
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
    """``call`` = ``send`` then ``receive``: shared by the worker process's handle and the in-process one."""

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
        self.proc.start()
        child.close()  # so a dead child gives EOF instead of a hang
        self.conn = parent
        return self.recv(timeout_s)

    def start(self, name: str = "deepgap-worker") -> DeviceCaps:
        """Start the process and wait until it has probed the device."""
        kind, payload = self.spawn(WORKER_MAIN, (self.device,), name, _START_TIMEOUT_S)
        if kind != "ready":
            self.stop()
            why = payload[1] if isinstance(payload, tuple) else payload
            raise UsageError(f"the worker could not use device {self.device}: {why}", "check `deepgap env`")
        self.caps = payload
        return payload

    def recv(self, timeout: float) -> tuple[str, Any]:
        """The worker's next message; `WorkerLost` (and the process killed) after ``timeout`` s or a crash."""
        if not self.conn.poll(timeout):
            self.kill()
            raise WorkerLost(Status.TIMEOUT, f"worker gave no answer within {timeout:.0f} s and was killed")
        try:
            reply = self.conn.recv()
            self.busy = False
            return reply
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


def protocol_for(spec: SweepSpec) -> TimingProtocol:
    """The timing protocol of a sweep."""
    return TimingProtocol(
        warmup=spec.warmup,
        iterations=spec.iterations,
        repeats=spec.repeats,
        target_ci=spec.target_ci,
        max_time_s=spec.max_time_s,
        min_time_s=spec.min_time_s,
    )


class Cascade:
    """The OOM/hang cascade, in one place.

    After a batch of a group ran out of memory or hung, the larger batches of the same group are
    skipped with that reason (never silently dropped, never silently shrunk).
    """

    def __init__(self) -> None:
        self.failed_at: dict[Any, str] = {}

    def skip_reason(self, group: Any) -> str | None:
        """Why ``group``'s next configuration is skipped, or None to measure it."""
        return self.failed_at.get(group)

    def note(self, group: Any, batch_size: int, status: Status | str) -> None:
        """Remember an OOM or a timeout of ``group`` at ``batch_size``."""
        why = cascade_reason(batch_size, status)
        if why:
            self.failed_at[group] = why


def cascade_reason(batch_size: int, status: Status | str) -> str | None:
    """Why the larger batches after ``batch_size`` are skipped (an OOM or a hang there), or None.

    The one wording of the cascade: one device's runner (`Cascade`), the profile run and the fleets'
    ladders (`deepgap.fleet.ray_backend`, whose batches run on other nodes) all skip with it.
    """
    status = Status(status)
    if status == Status.OOM:
        return f"batch {batch_size} of this configuration ran out of memory"
    if status == Status.TIMEOUT:
        return f"batch {batch_size} of this configuration hung past the timeout"
    return None


def needs_restart(status: Status | str, device: str) -> bool:
    """The CUDA-restart rule: an error or OOM can leave a GPU context unusable; a fresh worker is cheap."""
    return Status(status) in (Status.ERROR, Status.OOM) and device.startswith("cuda")


class SweepRunner:
    """Runs configurations through a worker, restarting it when it fails, and yields results.

    ``worker``: the handle to talk through instead of a new `WorkerHandle` — the serving worker's, so that
    its prelude runs in the process that serves (`deepgap.serving.process.ServingWorker`), or an in-process
    one in tests (`deepgap.drive.inprocess.InProcessWorker`).
    """

    def __init__(self, spec: SweepSpec, device: str, worker: CallProtocol | None = None) -> None:
        self.spec = spec
        self.device = device
        self.worker: Any = worker if worker is not None else WorkerHandle(device)
        self.timing = protocol_for(spec)
        self.telemetry_context: dict[str, Any] = {}  # run-level facts (idle power, steady clock) for requests
        self._sweep: int | None = None  # the sweep pass the live worker measured

    def start(self) -> DeviceCaps:
        """Start the first worker; returns what it found about the device."""
        return self.worker.start()

    def environment(self) -> dict[str, Any]:
        """The worker's environment fingerprint."""
        return self.worker.call("env", None, _START_TIMEOUT_S)

    def set_context(self, **facts: Any) -> None:
        """Add run-level facts (``idle_power_w``, ``ref_sm_clock_mhz``) that every later request carries."""
        self.telemetry_context.update(facts)

    def telemetry_settings(self, mode: str | None = None) -> TelemetrySettings | None:
        """The sweep's telemetry settings with the run-level facts so far (None: telemetry off)."""
        settings = settings_for(self.spec, self.telemetry_context)
        return dataclasses.replace(settings, mode=mode) if settings is not None and mode else settings

    def idle_baseline(self, settings: TelemetrySettings) -> dict[str, Any]:
        """The worker's idle baseline: ``{"summary": ..., "samples": [...]}``; a lost worker is a status."""
        try:
            return self.worker.call("idle", settings, settings.idle_s + 120.0)
        except (WorkerLost, WorkerFailed) as lost:
            return {"summary": {"status": f"unavailable: the worker was lost ({lost.reason})"}, "samples": []}

    def thermal_warmup(self, cfg: ConfigSpec, timeout_s: float) -> Result:
        """Load the device with ``cfg`` until its temperature is steady (telemetry mode ``thermal``)."""
        req = dataclasses.replace(self.request(cfg), telemetry=self.telemetry_settings(mode="thermal"))
        return self._call(req, "thermal", timeout_s + self.spec.timeout_s)

    def prelude(self, measure: PreludeMeasure, configs: Sequence[ConfigSpec]) -> None:
        """The run-level prelude on this runner's one device (`deepgap.drive.launcher.Launcher`)."""
        measure("", self, configs)

    def results(self, configs: Sequence[ConfigSpec]) -> Iterator[Started | Finished[Result]]:
        """Measure ``configs`` in order: `Started` before each, `Finished` after (OOM cascades as skipped)."""
        cascade = Cascade()
        for cfg in configs:
            yield Started("", cfg)
            why = cascade.skip_reason(cfg.group)
            if why is not None:
                res = Result(spec=cfg, status=Status.SKIPPED, reason=why)
            else:
                res = self._one(cfg)
                cascade.note(cfg.group, cfg.batch_size, res.status)
            yield Finished("", res)

    def run(
        self, configs: list[ConfigSpec], on_event: Callable[[Event], None] = lambda e: None
    ) -> Iterator[Result]:
        """`results` as `Result`s, with a progress `Event` before and after each configuration."""
        i = 0
        for item in self.results(configs):
            if isinstance(item, Started):
                on_event(Event(i, len(configs), item.cfg))
                continue
            on_event(Event(i, len(configs), item.result.spec, item.result))
            i += 1
            yield item.result

    def request(self, cfg: ConfigSpec) -> MeasureRequest:
        """What the worker is sent for ``cfg`` (public so a benchmark can measure exactly the same)."""
        return MeasureRequest(
            spec=cfg,
            protocol=self.timing,
            weights=self.spec.weights,
            seed=self.spec.seed,
            cudnn_benchmark=self.spec.cudnn_benchmark,
            options=dict(self.spec.options),
            telemetry=settings_for(self.spec, self.telemetry_context),
        )

    def _one(self, cfg: ConfigSpec) -> Result:
        if self._sweep is not None and cfg.sweep != self._sweep:
            # Each sweep in its own worker process: the between-sweep spread is then the spread between
            # processes that a user's next run will see, not repeats inside one (analysis.sweeps).
            self.restart()
        self._sweep = cfg.sweep
        return self._call(self.request(cfg), "measure", self.spec.timeout_s)

    def _call(self, req: MeasureRequest, kind: str, timeout_s: float) -> Result:
        """One measure-like request: a lost worker becomes the result's status; the CUDA-restart rule."""
        cfg = req.spec
        if not self.worker.alive():
            self.worker.start()
        t0 = time.time()
        try:
            res: Result = self.worker.call(kind, req, timeout_s)
        except (WorkerLost, WorkerFailed) as lost:
            return Result(
                spec=cfg, status=lost.status, reason=lost.reason, started_at=t0, duration_s=time.time() - t0
            )
        if needs_restart(res.status, cfg.device):
            self.restart()
        return res

    def call(self, kind: str, payload: Any, timeout_s: float) -> Any:
        """Any other worker request (``profile``, ``peaks``): a fresh worker is started if none runs.

        Raises `WorkerLost` or `WorkerFailed` as `WorkerHandle.call` does; apply `needs_restart` to the
        status of what comes back (and `restart` when it says so).
        """
        if not self.worker.alive():
            self.worker.start()
        return self.worker.call(kind, payload, timeout_s)

    def restart(self) -> None:
        """Stop the worker; the next request starts a fresh one (`needs_restart`, a new sweep pass)."""
        self.worker.stop()

    def close(self, wait: bool = True) -> None:
        """Stop the worker; ``wait=False`` kills it at once (its one job is done: a Ray task's)."""
        if wait:
            self.worker.stop()
        else:
            self.worker.kill()


def python_command() -> str:
    """The command line, for the run's record."""
    return " ".join(sys.argv)
