"""The one place deepgap imports NVML (nvidia-ml-py's ``pynvml``) and opens a GPU through it.

Why one place: NVML numbers every GPU of the host and ignores ``CUDA_VISIBLE_DEVICES``, and CUDA may
order devices fastest-first, so a GPU must be found by UUID, spelled the way NVML spells it; and a
missing package or driver must read the same everywhere. The telemetry backend
(`deepgap.measure.telemetry.nvml.NvmlBackend`), the environment fingerprint (`deepgap.core.envinfo`), the worker's
device-memory reading and ``deepgap monitor`` all come through here. Nothing here imports torch at
module level, and nothing touches a GPU until called (only worker processes call it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

MISSING = "nvidia-ml-py (pynvml) is not installed (pip install nvidia-ml-py)"


def module() -> tuple[Any | None, str | None]:
    """(the ``pynvml`` module, None), or (None, why it cannot be imported)."""
    try:
        import pynvml
    except ImportError:
        return None, MISSING
    return pynvml, None


def nvml_uuid(torch_uuid: str) -> str:
    """NVML's spelling of a CUDA device UUID (``torch.cuda.get_device_properties(i).uuid``)."""
    u = str(torch_uuid)
    return u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"


def cuda_uuid(device: str) -> str | None:
    """The NVML UUID of a torch CUDA device (``cuda`` / ``cuda:N``), or None if torch cannot tell."""
    try:
        import torch

        return nvml_uuid(str(torch.cuda.get_device_properties(torch.device(device)).uuid))
    except Exception:  # noqa: BLE001 - old torch without .uuid, no CUDA: the caller falls back
        return None


def handle(nv: Any, uuid: str | None = None, index: int = 0) -> Any:
    """The NVML handle of the GPU with ``uuid`` (either spelling), else of NVML index ``index``."""
    if uuid:
        try:
            return nv.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid))
        except Exception:  # noqa: BLE001 - a uuid NVML does not know: fall back to the index
            pass
    return nv.nvmlDeviceGetHandleByIndex(index)


@contextlib.contextmanager
def opened() -> Iterator[Any]:
    """NVML initialised for a with-block (``as nv``: the module) and shut down after it.

    Raises ImportError (nvidia-ml-py missing) or NVML's own error (no driver) on entry.
    """
    nv, why = module()
    if nv is None:
        raise ImportError(why)
    nv.nvmlInit()
    try:
        yield nv
    finally:
        nv.nvmlShutdown()
