"""Environment fingerprint: everything that could change a number, stored with every run.

The paper printed GPU name, driver and CUDA version and kept none of it; deepgap stores host, OS,
CPU, memory, library versions, and per GPU its name, UUID, driver, VBIOS, compute capability,
memory, power limit and clocks (read only, never changed); and which code measured: deepgap's version,
its source commit and a hash of its files (`source`), since every development copy calls itself
"0.1.0+src".
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from deepgap.core.redaction import REDACT_KEYS, redact, redact_text, redact_value


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def _deepgap_version() -> str:
    from deepgap.core.version import __version__

    return __version__


@functools.lru_cache(maxsize=1)
def source() -> dict[str, str | None]:
    """Which code measured: the git commit of deepgap's source tree and a hash of its installed files.

    ``deepgap_commit``: `git_commit` of the package's folder: a commit only where git tracks the
    package's own files (``+dirty`` with any change, untracked files included), else "none" (an
    installed wheel, or a copied tree inside somebody else's repository).
    ``deepgap_source_sha``: sha256 (12 hex digits) over the package's ``.py`` files, paths and contents:
    it tells two copies of "0.1.0+src" apart with or without git, so `compare` can warn when A and B
    were measured by different code; where the commit is "none" it is the only identity that stands.
    """
    import hashlib

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # deepgap/, above core/
    h = hashlib.sha256()
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                h.update(os.path.relpath(path, pkg).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return {"deepgap_commit": git_commit(pkg), "deepgap_source_sha": h.hexdigest()[:12]}


NO_COMMIT = "none"


def git_commit(pkg: str) -> str:
    """The commit of the package at ``pkg`` (12 hex digits, ``+dirty`` if changed), or "none".

    Why the checks: ``git rev-parse HEAD`` alone answers for *any* work tree above ``pkg``. A source
    tree copied without its .git into another repository (a device's scratch checkout, a vendored copy)
    then recorded that outer repository's HEAD, a commit that does not exist in deepgap. So the commit is
    recorded only when git tracks the package's own ``__init__.py``, and ``+dirty`` counts untracked files
    too (a new module changes what runs as much as an edited one).
    """
    import subprocess

    run = functools.partial(subprocess.run, cwd=pkg, capture_output=True, text=True, timeout=10, check=False)
    try:
        tracked = run(["git", "ls-files", "--error-unmatch", "--", "__init__.py"])
        if tracked.returncode != 0:
            return NO_COMMIT
        head = run(["git", "rev-parse", "HEAD"])
        if head.returncode != 0 or not head.stdout.strip():
            return NO_COMMIT
        dirty = run(["git", "status", "--porcelain", "--untracked-files=all", "--", "."]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return NO_COMMIT
    return head.stdout.strip()[:12] + ("+dirty" if dirty else "")


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
    from deepgap.core import nvml_access

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
        **source(),  # the commit and a hash of the code: which code measured (`source`)
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


# Identifiers of one machine: shared stores and reports replace them (--redact); `deepgap.core.redaction`
# says how and why. Re-exported here, where the fingerprint that holds them is made.
__all__ = [
    "REDACT_KEYS",
    "collect",
    "cpu_model",
    "nvml_gpu_info",
    "redact",
    "redact_text",
    "redact_value",
    "torch_build",
]
