"""Measured ceilings of the present device: matrix-multiply rate per precision and memory bandwidth.

Why measure: spec sheets give boost-clock, best-case numbers (the H100 SXM's 989 dense FP16 TFLOP/s); what a
model can reach is bounded by what cuBLAS reaches on this board, at its power limit and clocks. Each ceiling
is the median over repeats of a timed loop (CUDA events on GPUs, ``perf_counter`` on CPUs), after warm-up:

- ``fp32`` ``torch.matmul`` at n³ (n = 8192 on GPUs) with TF32 *off*; ``tf32`` the same with TF32 on;
  ``fp16``/``bf16`` the same in those dtypes; FLOPs = 2·n³ per call.
- ``int8``: ``torch._int_mm`` (int8 × int8 → int32, B column-major), in TOPS.
- ``fp8``: ``torch._scaled_mm`` with e4m3 inputs, unit scales, bf16 output and fast accumulation, on
  compute capability ≥ 8.9.
- ``memory``: a large device-to-device ``copy_`` (1 GiB, or 1/8 of free memory if less); bytes = read + write.

On a CPU: fp32 and bf16 matmul (n up to 2048, kept where one call takes about a second at most) and a
256 MiB copy; other precisions are stored as
skipped with the reason. Nothing is ever filled in from a table: an unmeasurable ceiling says why.
Only the worker imports this module (`deepgap.roofline.worker`), so torch is imported at its top.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from deepgap.core.precision import PRECISIONS
from deepgap.measure.device import CudaEventClock
from deepgap.measure.timing import HostClock
from deepgap.roofline.peaks import NAMES, PeakMeasurement


def _timer(device: str) -> Callable[[Callable[[], object], int], float]:
    """Returns ``time(fn, n) -> seconds per call`` for ``n`` back-to-back calls on ``device``.

    The measurement's own clocks (`deepgap.measure.device.CudaEventClock` on a GPU: events on the device's
    stream after a synchronize; `deepgap.measure.timing.HostClock` on a CPU), so a ceiling and the
    runs held to it are timed alike.
    """
    clock = CudaEventClock(device) if device.startswith("cuda") else HostClock()
    return lambda fn, n: clock.time_window(fn, n) / n


def time_per_call(
    fn: Callable[[], object], device: str, repeats: int = 5, min_time_s: float = 0.2, warmup: int = 2
) -> tuple[float, dict[str, Any]]:
    """Median seconds per call over ``repeats`` loops, each long enough to last ``min_time_s``."""
    run = _timer(device)
    for _ in range(warmup):
        fn()
    one = run(fn, 1)
    n = max(1, min(1000, int(min_time_s / max(one, 1e-9))))
    per_call = [run(fn, n) for _ in range(repeats)]
    return statistics.median(per_call), {
        "calls_per_repeat": n,
        "repeats": repeats,
        "per_call_s": per_call,
        "best_s": min(per_call),
    }


def _skip(name: str, reason: str) -> PeakMeasurement:
    kind = "bandwidth" if name == "memory" else "matmul"
    unit = "GB/s" if name == "memory" else PRECISIONS[name].peak_unit
    return PeakMeasurement(name, kind, None, unit, "skipped", f"unavailable: {reason}")


def _why_not(name: str, device: str, cc: tuple[int, int] | None) -> str | None:
    if not device.startswith("cuda"):
        return {
            "tf32": "tf32 is a tensor-core mode of NVIDIA GPUs; this device is a CPU",
            "fp16": "deepgap measures fp32 and bf16 matmul ceilings on CPUs, not fp16",
            "int8": "the int8 ceiling uses torch._int_mm on CUDA; not measured on CPUs",
            "fp8": "the fp8 ceiling uses torch._scaled_mm on NVIDIA GPUs with compute capability >= 8.9",
        }.get(name)
    cc = cc or (0, 0)
    if name in ("tf32", "bf16") and cc < (8, 0):
        return f"{name} tensor cores need compute capability >= 8.0; this GPU has {cc[0]}.{cc[1]}"
    if name == "fp8" and cc < (8, 9):
        return f"fp8 (torch._scaled_mm) needs compute capability >= 8.9; this GPU has {cc[0]}.{cc[1]}"
    return None


def _matmul_fn(name: str, n: int, device: str):
    """A zero-argument callable doing one n³ multiply in ``name``'s precision, plus restore()."""
    restore = (torch.backends.cuda.matmul.allow_tf32,)

    def undo():
        torch.backends.cuda.matmul.allow_tf32 = restore[0]

    g = torch.Generator(device="cpu").manual_seed(0)
    if name in ("fp32", "tf32", "fp16", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
            name
        ]
        a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        return (lambda: torch.matmul(a, b)), undo, {"op": "torch.matmul", "dtype": str(dtype)}
    if name == "int8":
        a = torch.randint(-128, 127, (n, n), generator=g, dtype=torch.int8).to(device)
        b = torch.randint(-128, 127, (n, n), generator=g, dtype=torch.int8).to(device).t()
        return (
            (lambda: torch._int_mm(a, b)),
            undo,
            {"op": "torch._int_mm", "layout": "A row-major, B column-major"},
        )
    if name == "fp8":
        a = torch.randn(n, n, generator=g).to(device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, generator=g).to(device).to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)

        def fn():
            return torch._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
            )

        return (
            fn,
            undo,
            {
                "op": "torch._scaled_mm",
                "dtype": "float8_e4m3fn",
                "out_dtype": "bfloat16",
                "use_fast_accum": True,
            },
        )
    raise ValueError(name)


def measure_matmul(
    name: str, device: str, n: int, repeats: int = 5, min_time_s: float = 0.2, max_call_s: float | None = None
) -> PeakMeasurement:
    """Matmul ceiling of one precision at n×n×n (TFLOP/s; TOPS for int8).

    With ``max_call_s`` (used on CPUs, whose bf16 GEMM can be 100× slower than fp32), n grows from 256 by
    doubling up to ``n`` while one call stays under that time; the n used is in ``details``.
    """
    unit = PRECISIONS[name].peak_unit
    fn = undo = None
    try:
        if max_call_s is not None:
            target, n = n, min(256, n)
            while n < target:
                fn, undo, info = _matmul_fn(name, n, device)
                t0 = time.perf_counter()
                fn()
                undo()
                if (time.perf_counter() - t0) * 8 > max_call_s:
                    break
                n *= 2
        fn, undo, info = _matmul_fn(name, n, device)
        per_call_s, timing = time_per_call(fn, device, repeats, min_time_s)
    except Exception as exc:  # unsupported kernel on this build/GPU, OOM …
        return PeakMeasurement(
            name, "matmul", None, unit, "error", f"unavailable: {type(exc).__name__}: {exc}"[:400]
        )
    finally:
        if undo is not None:
            undo()
    flops = 2.0 * n**3
    return PeakMeasurement(
        name,
        "matmul",
        flops / per_call_s / 1e12,
        unit,
        "ok",
        details={
            "m": n,
            "n": n,
            "k": n,
            "flops_per_call": flops,
            **info,
            **timing,
            "best_value": flops / timing["best_s"] / 1e12,
        },
    )


def measure_bandwidth(
    device: str, n_bytes: int | None = None, repeats: int = 5, min_time_s: float = 0.2
) -> PeakMeasurement:
    """Device-memory bandwidth from a large ``dst.copy_(src)`` (GB/s, counting read + write bytes)."""
    try:
        if n_bytes is None:
            if device.startswith("cuda"):
                free, _ = torch.cuda.mem_get_info(torch.device(device))
                n_bytes = int(min(1 << 30, free // 8))
            else:
                n_bytes = 256 << 20
        src = torch.ones(n_bytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        per_call_s, timing = time_per_call(lambda: dst.copy_(src), device, repeats, min_time_s)
    except Exception as exc:
        return PeakMeasurement(
            "memory", "bandwidth", None, "GB/s", "error", f"unavailable: {type(exc).__name__}: {exc}"[:400]
        )
    moved = 2.0 * n_bytes
    op = "device-to-device copy_" if device.startswith("cuda") else "host memory copy_"
    return PeakMeasurement(
        "memory",
        "bandwidth",
        moved / per_call_s / 1e9,
        "GB/s",
        "ok",
        details={
            "op": op,
            "buffer_bytes": n_bytes,
            "bytes_per_call": moved,
            **timing,
            "best_value": moved / timing["best_s"] / 1e9,
        },
    )


def measure_peaks(
    device: str = "cuda",
    size: int | None = None,
    bandwidth_bytes: int | None = None,
    names: tuple[str, ...] = NAMES,
    repeats: int = 5,
    min_time_s: float = 0.2,
) -> list[PeakMeasurement]:
    """Measure every ceiling in ``names`` on ``device``; unsupported ones come back skipped with the reason.

    Args:
        device: ``cuda``, ``cuda:N`` or ``cpu``.
        size: matmul n (default 8192 on GPUs, 2048 on CPUs).
        bandwidth_bytes: copy buffer size (default 1 GiB on GPUs or 1/8 of free memory; 256 MiB on CPUs).
        names: which ceilings.
        repeats: timed loops per ceiling (the median is reported).
        min_time_s: length of each timed loop.
    """
    cuda = device.startswith("cuda")
    cc = None
    if cuda:
        if device == "cuda":  # set_device needs an index; plain "cuda" means the current one
            device = f"cuda:{torch.cuda.current_device()}"
        torch.cuda.set_device(torch.device(device))
        p = torch.cuda.get_device_properties(torch.device(device))
        cc = (p.major, p.minor)
    n = size or (8192 if cuda else 2048)
    out: list[PeakMeasurement] = []
    for name in names:
        why = _why_not(name, device, cc)
        if why:
            out.append(_skip(name, why))
        elif name == "memory":
            out.append(measure_bandwidth(device, bandwidth_bytes, repeats, min_time_s))
        else:
            out.append(measure_matmul(name, device, n, repeats, min_time_s, None if cuda else 1.0))
        if cuda:
            torch.cuda.empty_cache()
    return out
