"""Environment fingerprint: everything that could change a number, stored with every run.

The paper printed GPU name, driver and CUDA version and kept none of it; deepgap stores host, OS,
CPU, memory, library versions, and per GPU its name, UUID, driver, VBIOS, compute capability,
memory, power limit and clocks (read only, never changed).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from deepgap.redaction import REDACT_KEYS, redact, redact_text, redact_value


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _deepgap_version() -> str:
    from deepgap import __version__

    return __version__


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux) or platform."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvml_gpu_info(index: int, uuid: str | None = None) -> dict[str, Any]:
    """Static facts about GPU ``index`` through NVML, or ``{"nvml": "unavailable: <reason>"}``.

    ``uuid`` (torch's, when known) finds the GPU by identity: NVML numbers every GPU of the host and
    ignores ``CUDA_VISIBLE_DEVICES`` (which Ray sets per task), so index 0 may be another GPU.
    """
    from deepgap import nvml_access

    nv, why = nvml_access.module()
    if nv is None:
        return {"nvml": f"unavailable: {why}"}
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …
        return {"nvml": f"unavailable: {exc}"}
    info: dict[str, Any] = {"nvml": "ok"}
    try:
        h = nvml_access.handle(nv, uuid, index)
        readers = {
            "gpu_name": nv.nvmlDeviceGetName,
            "gpu_uuid": nv.nvmlDeviceGetUUID,
            "vbios": nv.nvmlDeviceGetVbiosVersion,
            "gpu_serial": nv.nvmlDeviceGetSerial,
            "power_limit_w": lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "max_sm_clock_mhz": lambda h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "max_mem_clock_mhz": lambda h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            "persistence_mode": nv.nvmlDeviceGetPersistenceMode,
            "pcie_gen": nv.nvmlDeviceGetCurrPcieLinkGeneration,
            "pcie_width": nv.nvmlDeviceGetCurrPcieLinkWidth,
            "ecc_mode": lambda h: nv.nvmlDeviceGetEccMode(h)[0],
            "mig_mode": lambda h: nv.nvmlDeviceGetMigMode(h)[0],
        }
        for key, fn in readers.items():
            try:
                v = fn(h)
                info[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as exc:  # not supported on this GPU/driver
                info[key] = f"unavailable: {exc}"
        v = nv.nvmlSystemGetDriverVersion()
        info["driver"] = v.decode() if isinstance(v, bytes) else v
    finally:
        nv.nvmlShutdown()
    return info


def torch_build(torch: Any) -> str:
    """Which build of torch this is: ``cpu``, ``cuda 13.0`` or ``rocm 6.2`` (a CUDA build runs on CPUs too)."""
    if getattr(torch.version, "hip", None):
        return f"rocm {torch.version.hip}"
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    return "cpu"


def collect(device: str = "cpu") -> dict[str, Any]:
    """The fingerprint of this process's environment for ``device`` (call inside the worker)."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpu_logical_cores": os.cpu_count(),
        "deepgap": _deepgap_version(),
        "torch": str(torch.__version__),  # TorchVersion would import torch wherever it is unpickled
        "torch_build": torch_build(torch),
        "torchvision": _version("torchvision"),
        "numpy": _version("numpy"),
        "onnxruntime": _version("onnxruntime"),
        "tensorrt": _version("tensorrt"),
        "timm": _version("timm"),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torch_num_threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        import psutil

        env["cpu_physical_cores"] = psutil.cpu_count(logical=False)
        env["memory_bytes"] = psutil.virtual_memory().total
    except ImportError:
        pass
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        env.update(
            device_name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            gpu_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
        )
        env.update(nvml_gpu_info(idx, str(getattr(props, "uuid", "") or "") or None))
    else:
        env["device_name"] = env["cpu_model"]
    return env


# Identifiers of one machine: shared stores and reports replace them (--redact); `deepgap.redaction`
# says how and why. Re-exported here, where the fingerprint that holds them is made.
__all__ = ["REDACT_KEYS", "collect", "cpu_model", "nvml_gpu_info", "redact", "redact_text", "redact_value",
           "torch_build"]
