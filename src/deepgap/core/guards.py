"""Guards that keep a number that cannot be true out of the store, or out of every answer.

Why: on a host with two GPUs the worker of lane ``cuda:1`` ran its model on ``cuda:1`` while its CUDA
events stayed on ``cuda:0``, and stored 45,521 img/s of ResNet-50 in strict fp32 — 370 TFLOP/s on a GPU
whose datasheet says 67 — beside a pipelined figure of 3,929 (issue 34). Nothing said a word. Three
guards, each cheap enough to run on every configuration, on one GPU as on many:

- `device_mismatch` (in the worker, before and after timing): the model's inputs, the timing clock's
  stream and events and a captured graph are all on the device the configuration names. A mismatch is
  an error status with the reason, never a number.
- `rate_flag` (when GPU measurements are read, `deepgap.analysis.frame.prepare`): per-call throughput
  (batch / median synchronized latency) and pipelined throughput (back-to-back windows) of one
  measurement that disagree by more than `RATE_TOLERANCE`× flag the measurement, so it is left out of
  its configuration's numbers and never recommended. Applied when reading, it also catches rows already
  stored. The tolerance comes from every committed H100/H200 store (1,263 rows): the two figures differ
  by at most 1.62× there (eager bs1, launch-bound); the bad lane's rows were 2.9× and 11.6×.
- `above_peak` (in the worker, on the finished result): FLOPs per image (`deepgap.measure.models.flops`, stored
  as ``flops_per_image``) × images/s above the datasheet's dense peak for the precision
  (``data/gpu_specs.csv``, the column named by `deepgap.core.precision`) is stored as an error that says so.
  The highest share of peak in the committed stores is 0.58 (ResNet-18 fp32).

The datasheet is read here with the standard library because the worker (core layer) may not import
`deepgap.roofline.specs` (a feature); both read the one file, and match device names the same way
(each row's ``match`` pattern in file order).
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Mapping
from typing import Any

from deepgap.core.precision import PRECISIONS
from deepgap.core.records import Result, Status

RATE_TOLERANCE = 2.0  # per-call vs pipelined throughput: the larger over the smaller
RATE_FLAG = "rate-mismatch"
RATE_REASON = (
    f"flagged: per-call and pipelined throughput disagree by more than {RATE_TOLERANCE:g}x "
    "(a timing that cannot be true)"
)
ABOVE_PEAK = "above datasheet peak"


def _norm(device: str) -> str:
    d = str(device)
    return "cuda:0" if d == "cuda" else d


def device_mismatch(
    expected: str, observed: Mapping[str, str | None], current: str | None = None
) -> str | None:
    """Why the measured work is not all on ``expected``, or None.

    Args:
        expected: the configuration's device (``cuda:1``; plain ``cuda`` means ``current``).
        observed: what sits where, e.g. ``{"inputs": "cuda:1", "start event": "cuda:0"}``; None values
            (nothing recorded yet) are ignored.
        current: the worker's current CUDA device, which plain ``cuda`` stands for.
    """
    want = _norm(current) if str(expected) == "cuda" and current else _norm(expected)
    wrong = {k: _norm(v) for k, v in observed.items() if v is not None and _norm(v) != want}
    if not wrong:
        return None
    where = ", ".join(f"{k} on {v}" for k, v in sorted(wrong.items()))
    return (
        f"device mismatch: the configuration runs on {want} but {where}; its timings would measure "
        "another GPU, so no number is stored (the worker must make its device current)"
    )


def rate_flag(
    per_call_ips: float | None,
    pipelined_ips: float | None,
    tolerance: float = RATE_TOLERANCE,
    device: str = "cuda",
) -> str | None:
    """The flag of a GPU measurement whose per-call and pipelined throughputs disagree beyond ``tolerance``×.

    Only GPU rows (``device`` ``cuda[:N]``): there the per-call figure is CUDA-event time, and a clock on
    another device than the work is what makes the two disagree. On a CPU both come from the same host
    clock, and a gap means a busy host (a window's total time against the median of single calls): a
    2-core VM shared by other jobs gave tinycnn 2,465 per-call vs 470 pipelined img/s — noise that the CI
    width and the between-sweep spread already report, not a number that cannot be true.
    """
    if not str(device).startswith("cuda"):
        return None
    try:
        a, b = float(per_call_ips), float(pipelined_ips)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not (a > 0 and b > 0) or a != a or b != b:
        return None
    if max(a, b) / min(a, b) <= tolerance:
        return None
    return f"{RATE_FLAG}(per-call {a:.4g} vs pipelined {b:.4g} img/s)"


def is_rate_flag(flag: str) -> bool:
    """Whether ``flag`` is `rate_flag`'s (for answers that say why a row was skipped)."""
    return str(flag).startswith(RATE_FLAG)


@functools.lru_cache(maxsize=1)
def _sheet() -> tuple[dict[str, str], ...]:
    from importlib.resources import files

    with (files("deepgap") / "data" / "gpu_specs.csv").open(encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


def datasheet_peak(device_name: str | None, precision: str) -> tuple[float, str, str] | None:
    """(peak operations/s, the precision whose column gave it, the sheet's GPU) for a device, or None.

    A precision without its own figure on the sheet uses its ``peak_fallback``'s (tf32 → fp32).
    """
    p = PRECISIONS.get(precision)
    if not device_name or p is None:
        return None
    row = next((r for r in _sheet() if re.search(r["match"], device_name, re.IGNORECASE)), None)
    if row is None:
        return None
    for name in (precision, p.peak_fallback):
        q = PRECISIONS.get(name or "")
        try:
            value = float(row.get(q.peak_column, "") if q else "")
        except ValueError:
            continue
        if value > 0:
            return value * 1e12, name or precision, row["gpu"]
    return None


def above_peak(
    device_name: str | None, precision: str, flops_per_image: float | None, ips: float | None
) -> str | None:
    """Why ``ips`` images/s at ``flops_per_image`` cannot be true on ``device_name``, or None."""
    peak = datasheet_peak(device_name, precision)
    if peak is None or not flops_per_image or not ips or flops_per_image <= 0 or ips <= 0:
        return None
    rate = float(flops_per_image) * float(ips)
    value, column, gpu = peak
    if rate <= value:
        return None
    unit = PRECISIONS[column].peak_unit
    return (
        f"{ABOVE_PEAK}: {ips:,.0f} img/s × {flops_per_image / 1e9:.3g} GFLOP/img = {rate / 1e12:,.0f} "
        f"{unit}, above the {value / 1e12:,.4g} {unit} {column} peak of the {gpu} datasheet; the timing "
        "cannot be true, so no number is stored"
    )


def current_device(kind: str) -> str | None:
    """The process's current CUDA device (``cuda:N``) for a CUDA worker, None on a CPU."""
    if kind != "cuda":
        return None
    import torch

    return f"cuda:{torch.cuda.current_device()}"


def observed_devices(x: Any, prepared: Any, clock: Any, kind: str) -> dict[str, str | None]:
    """Where one configuration's work sits: inputs, a captured graph, the clock's stream and events.

    The worker reads it before timing and again after (an event has a device only once recorded) and
    hands it to `device_mismatch`; a graph runner says where it captured (``run.capture_device``), a
    CUDA clock where its stream and events are (``clock.devices()``). Tests replace it to fake a
    mismatch on a CPU.
    """
    graph = getattr(getattr(prepared, "run", None), "capture_device", None)  # a GraphRunner's
    out: dict[str, str | None] = {"inputs": str(x.device), "captured graph": str(graph) if graph else None}
    devices = getattr(clock, "devices", None)
    if devices is not None:
        out.update(devices())
    cur = current_device(kind)
    if cur is not None:
        out["current device"] = cur
    return out


def rate_checked(result: Result, device_name: str | None) -> Result:
    """``result``, or an error result (same spec, FLOPs, details) saying why its rate cannot be true."""
    rates = [r for r in (result.throughput_ips, result.throughput_pipelined_ips) if r]
    why = above_peak(device_name, result.spec.precision, result.flops_per_image, max(rates, default=None))
    if why is None:
        return result
    bad = Result(
        spec=result.spec,
        status=Status.ERROR,
        reason=why,
        flops_per_image=result.flops_per_image,
        params=result.params,
        weights_sha=result.weights_sha,
    )
    bad.details = result.details
    return bad
