"""The device facts a worker needs: which device is current, what it is, OOM, dtypes, the CUDA-event clock.

Why apart from the worker process (`deepgap.measure.worker`): these are small, pure helpers that worker
code of every feature uses (the roofline's profiler and the serving worker as well as the sweep's), with
the tensor dtype and TF32 flags a precision of `deepgap.core.precision.PRECISIONS` computes in. Only
worker-side code imports this module, so torch is imported at its top.
"""

from __future__ import annotations

import torch

from deepgap.core import envinfo
from deepgap.core.precision import PRECISIONS, DeviceCaps
from deepgap.measure.timing import Step


def is_oom(exc: BaseException) -> bool:
    """True for CUDA and CPU out-of-memory errors."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or "can't allocate memory" in msg or isinstance(exc, MemoryError)
    )


def bind_device(device: str) -> None:
    """Make ``device`` this process's current CUDA device, before any other CUDA work.

    Why: a stream, an event or a graph capture made without a device argument lands on the *current*
    device. A worker of lane ``cuda:1`` that left ``cuda:0`` current ran its model on ``cuda:1`` and
    timed ``cuda:0`` (issue 34). Under Ray (``CUDA_VISIBLE_DEVICES`` narrowed to the task's GPU) the
    device is plain ``cuda``: index 0 of what the process sees. NVML still finds the physical GPU by
    UUID (`deepgap.core.nvml_access.cuda_uuid`), whatever the numbering. A CPU device needs nothing.
    """
    if not str(device).startswith("cuda"):
        return
    dev = torch.device(device)
    torch.cuda.set_device(dev.index if dev.index is not None else 0)


def device_caps(device: str) -> DeviceCaps:
    """Probe ``device`` (creates the CUDA context in this worker, never in the parent)."""
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        return DeviceCaps(device, "cuda", p.name, (p.major, p.minor), p.total_memory)
    return DeviceCaps(device, "cpu", envinfo.cpu_model())


def torch_dtype(precision: str) -> torch.dtype:
    """The tensor dtype a precision stores and computes in (tf32 stores fp32)."""
    return getattr(torch, PRECISIONS[precision].dtype)


def set_tf32(precision: str) -> None:
    """Allow TF32 tensor cores exactly when the precision asks for them (process-wide flags)."""
    p = PRECISIONS.get(precision)
    allow = bool(p and p.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


class CudaEventClock:
    """CUDA events recorded on ``device``'s current stream around the work; the host waits on the end event.

    Events measure device time between the two records, so host-side jitter before the launch is
    excluded but launch gaps inside the region are included — what an inference call costs.

    The device is explicit everywhere: the events are made under ``torch.cuda.device(device)`` and
    recorded on that device's stream. ``Event.record()`` with no stream records on the *current*
    device's stream; a worker measuring on ``cuda:1`` while ``cuda:0`` was current timed an idle GPU
    (issue 34: 45,521 img/s of "fp32" on a lane whose pipelined figure was 3,929). `devices` says
    where the events really were, for the worker's guard (`deepgap.core.guards.device_mismatch`).
    """

    def __init__(self, device: str) -> None:
        self.torch = torch
        self.device = torch.device(device)
        if self.device.index is None:  # plain "cuda": the current device, named
            self.device = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(self.device):
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def _stream(self):
        return self.torch.cuda.current_stream(self.device)

    def devices(self) -> dict[str, str]:
        """Where this clock's stream and (once recorded) events are: ``{"timing stream": "cuda:1", ...}``."""
        out = {"timing stream": str(self._stream().device)}
        for name, ev in (("start event", self.start), ("end event", self.end)):
            dev = getattr(ev, "device", None)  # None until the event is first recorded
            if dev is not None:
                out[name] = str(dev)
        return out

    def time_iteration(self, step: Step) -> float:  # noqa: D102
        self.torch.cuda.synchronize(self.device)
        stream = self._stream()
        self.start.record(stream)
        step()
        self.end.record(stream)
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e-3

    def time_window(self, step: Step, n: int) -> float:  # noqa: D102
        self.torch.cuda.synchronize(self.device)
        stream = self._stream()
        self.start.record(stream)
        for _ in range(n):
            step()
        self.end.record(stream)
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e-3
