"""The device facts a worker needs before it measures: which device is current, what it is, and OOM.

Why apart from the worker process (`deepgap.measure.worker`): these are small, pure helpers that worker
code of every feature uses (the roofline's profiler and the serving worker as well as the sweep's), and
that modules the parent imports may name; torch is imported inside them, on first use, in the worker.
"""

from __future__ import annotations

from deepgap.core import envinfo
from deepgap.core.precision import DeviceCaps


def is_oom(exc: BaseException) -> bool:
    """True for CUDA and CPU out-of-memory errors."""
    import torch

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
    import torch

    dev = torch.device(device)
    torch.cuda.set_device(dev.index if dev.index is not None else 0)


def device_caps(device: str) -> DeviceCaps:
    """Probe ``device`` (creates the CUDA context in this worker, never in the parent)."""
    import torch

    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        return DeviceCaps(device, "cuda", p.name, (p.major, p.minor), p.total_memory)
    return DeviceCaps(device, "cpu", envinfo.cpu_model())
