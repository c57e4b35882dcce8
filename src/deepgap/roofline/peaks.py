"""The roofline's measured ceilings as the parent sees them: their names, one measurement, the request.

`deepgap.roofline.peaks_measure` measures them in the worker process (what each ceiling is and how it is
timed is said there); `deepgap.roofline.peaks_run` is the parent's job that asks for them and stores them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

NAMES = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8", "memory")


@dataclass
class PeakMeasurement:
    """One measured ceiling (or why it could not be measured)."""

    name: str  # fp32 | tf32 | fp16 | bf16 | int8 | fp8 | memory
    kind: str  # matmul | bandwidth
    value: float | None  # TFLOP/s (TOPS for int8) or GB/s
    unit: str
    status: str = "ok"  # ok | skipped | error
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for the store and --json)."""
        return asdict(self)


@dataclass(frozen=True)
class PeaksRequest:
    """The ``peaks`` worker request (`deepgap.roofline.worker`): `peaks_measure.measure_peaks`'s arguments."""

    size: int | None = None
    bandwidth_bytes: int | None = None
    names: tuple[str, ...] = NAMES
    repeats: int = 5
