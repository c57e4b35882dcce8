"""The worker process: measures what the parent sends over a pipe, one handler per request kind.

Why a separate process: a segfault, a hang, a sticky CUDA error or a leaked allocation costs the
configuration in flight only — the parent records it and starts a fresh worker. A worker keeps the
models it built, so a batch sweep of one model builds it once.

The protocol (one for every kind of run): a handler is a function ``(state, payload) -> value`` that
registers itself under a request kind with `handles` when its worker module is imported (env and idle
below; measuring one configuration in `deepgap.measure.configuration`; the features' own in
`deepgap.serving.worker.handlers` and `deepgap.roofline.worker`). The parent sends ``(kind, module, payload)``
(`deepgap.measure.protocol` names the module of each kind) and never imports this module or any other
worker module: this process imports ``module``, finds the kind's handler and answers ``("ok", value)``,
or ``("failed", (status, reason, traceback))`` when the handler raised (`failure` is the one
exception → status mapping). The parent side is `deepgap.drive.handle.WorkerHandle.call`; the process
starts at `serve`, named by `deepgap.measure.protocol.WORKER_MAIN`.
"""

from __future__ import annotations

import copy
import gc
import importlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import scipy.stats  # noqa: F401 — the worker's CIs need it; loaded here, never inside a timed-out request
import torch

from deepgap.core import envinfo, nvml_access, progress
from deepgap.core.records import ConfigSpec, Status
from deepgap.measure.device import bind_device, device_caps, is_oom
from deepgap.measure.models.build import build_model, example_batch, weights_fingerprint
from deepgap.measure.models.flops import count_flops
from deepgap.measure.protocol import StatusError
from deepgap.measure.telemetry.measuring import measure_idle

CORRECTNESS_IMAGES = 8  # rows compared against the fp32 reference

Handler = Callable[[Any, Any], Any]  # (WorkerState, payload) -> the reply's value

# Request kind → its handler, filled by `handles` as worker modules are imported in the worker process.
HANDLERS: dict[str, Handler] = {}


def handles(*kinds: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of each request kind in ``kinds``."""

    def register(fn: Handler) -> Handler:
        for kind in kinds:
            HANDLERS[kind] = fn
        return fn

    return register


def failure(exc: BaseException) -> tuple[Status, str, str]:
    """The one exception → (status, one-line reason, traceback) mapping of every handler.

    OOM is its own status (the parent cascades it to larger batches) and carries no traceback;
    a `StatusError` keeps its status; anything else is an error with the traceback's tail.
    """
    if isinstance(exc, StatusError):
        return exc.status, exc.reason, ""
    oom = is_oom(exc)
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
    return (Status.OOM, reason, "") if oom else (Status.ERROR, reason, traceback.format_exc()[-4000:])


def resolve(kind: str, module: str) -> Handler:
    """The handler of ``kind``, registered when worker module ``module`` is imported (here, in the worker)."""
    importlib.import_module(module)
    if kind not in HANDLERS:
        raise ValueError(f"worker module {module} registers no handler for {kind!r}")
    return HANDLERS[kind]


class WorkerState:
    """Caches of one worker: built models, fp32 references, FLOP counts."""

    def __init__(self, device: str) -> None:

        if torch.get_num_interop_threads() != 1:  # torch allows one setting per process; tests make several
            torch.set_num_interop_threads(1)  # the paper's host-side setting, once per process
        self.default_threads = torch.get_num_threads()
        bind_device(device)  # first: every stream, event and capture below lands on this device
        self.device = device
        self.caps = device_caps(device)
        self.models: dict[tuple[str, int, str | None, int], Any] = {}
        self.refs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.flops: dict[tuple[str, int, str | None, int], tuple[float | None, int, str]] = {}
        self.telemetry: dict[str, Any] = {}  # telemetry backends by name, opened on first use
        self.held: dict[str, Any] = {}  # what a handler keeps for the next requests (the serving executor)

    def model(self, name: str, res: int, weights: str | None, seed: int):
        """A fresh fp32 CPU copy of the model (engines may mutate what they receive)."""
        key = (name, res, weights, seed)
        if key not in self.models:
            self.models = {key: build_model(name, res, weights, seed)}  # keep one model in memory
        return copy.deepcopy(self.models[key])

    def model_facts(
        self, name: str, res: int, weights: str | None, seed: int
    ) -> tuple[float | None, int, str]:
        """(FLOPs per image, parameter count, weights fingerprint), computed once per model."""
        key = (name, res, weights, seed)
        if key not in self.flops:
            m = self.model(name, res, weights, seed)
            try:
                with torch.inference_mode():
                    flops: float | None = count_flops(m, example_batch(name, 1, res))
            except Exception:
                flops = None
            self.flops[key] = (flops, sum(p.numel() for p in m.parameters()), weights_fingerprint(m))
        return self.flops[key]

    @staticmethod
    def reference_inputs(name: str, res: int, seed: int):
        """`reference`'s inputs alone: CORRECTNESS_IMAGES seeded images (or a text model's token ids)."""
        return example_batch(name, CORRECTNESS_IMAGES, res, torch.Generator().manual_seed(seed + 1))

    def reference(self, name: str, res: int, weights: str | None, seed: int, lengths: tuple[int, ...] = ()):
        """Fixed inputs (CORRECTNESS_IMAGES rows, seeded) and the fp32 eager logits on the CPU.

        ``lengths``: a mixed-length text input's reference rows (`deepgap.measure.models.text_batch`): row i
        is run alone, cut to its length, through the model's plain path, so the packed or masked batch is
        checked against arithmetic that never packs or masks. The last two references stay cached (a
        sweep alternates a model's full-length and mixed-length rows).
        """
        key = (name, res, weights, seed, lengths)
        if key not in self.refs:
            x = self.reference_inputs(name, res, seed)
            m = self.model(name, res, weights, seed)
            with torch.inference_mode():  # one image at a time: small memory, any batch-size limit
                rows = [x[i : i + 1, : lengths[i]] if lengths else x[i : i + 1] for i in range(x.shape[0])]
                self.refs = {
                    **dict(list(self.refs.items())[-1:]),
                    key: (x, torch.cat([m(r).float() for r in rows])),
                }
        return self.refs[key]


def inputs_for(spec: ConfigSpec, ref_x, dtype):
    """Random (never zero) inputs for the batch; the first rows are the reference rows (ids stay int64)."""
    g = torch.Generator().manual_seed(1234 + spec.batch_size)
    x = example_batch(spec.model, spec.batch_size, spec.resolution, g)
    k = min(spec.batch_size, ref_x.shape[0])
    x[:k] = ref_x[:k]
    if not x.is_floating_point():
        return x, k
    x = x.to(dtype)
    if spec.memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x, k


def true_peak(final: int | None, sampled: int | None) -> int | None:
    """Device memory used at its peak: the sampler's maximum during the protocol or the reading after it."""
    return max((v for v in (final, sampled) if v is not None), default=None)


def nvml_used_bytes(device: str) -> int | None:
    """Device-wide used memory (NVML) — includes the CUDA context and other processes."""
    try:
        with nvml_access.opened() as nv:
            uuid = nvml_access.cuda_uuid(device)
            if uuid is None:
                return None
            return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByUUID(uuid)).used)
    except Exception:  # noqa: BLE001 - no NVML or no such GPU: the field stays empty
        return None


@handles("env")
def handle_env(state: WorkerState, payload: Any) -> dict[str, Any]:
    """The environment fingerprint of the worker's device."""
    return envinfo.collect(state.device)


@handles("idle")  # payload: TelemetrySettings
def handle_idle(state: WorkerState, settings: Any) -> dict[str, Any]:
    """The run-level idle baseline (``settings``: TelemetrySettings)."""
    return measure_idle(state.telemetry, state.device, settings)


def requests(conn) -> Iterator[tuple[str, str, Any]]:
    """``(kind, module, payload)`` requests from the parent until it sends None or closes the pipe."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        yield msg


def serve(conn, device: str) -> None:
    """Worker main loop: say ``ready`` (or ``failed``), then answer requests until None.

    A handler's progress lines (`deepgap.core.progress.say`) go to the parent as ``("progress", line)``
    before its answer.

    What the process holds when it starts (torch, scipy and the rest, imported by the fork server) is
    not this worker's garbage: `gc.freeze` keeps the collector off it, so the ``gc.collect()`` after each
    configuration (`deepgap.measure.configuration`) walks what the worker made, not torch's ~360,000
    objects (~0.3 s each time on a 2-core host), and never writes to pages shared with the fork server.
    """
    gc.freeze()
    try:
        state = WorkerState(device)
        conn.send(("ready", state.caps))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("failed", failure(exc)))
        return
    for kind, module, payload in requests(conn):
        try:
            with progress.sink(lambda line: conn.send(("progress", line))):
                reply: tuple[str, Any] = ("ok", resolve(kind, module)(state, payload))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the parent gets a status, never a dead pipe
            reply = ("failed", failure(exc))
        conn.send(reply)
