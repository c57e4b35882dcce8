"""The roofline's worker handlers: ``profile`` and ``peaks``, run in the worker process only.

The parent (`deepgap.roofline.profile_run`, `deepgap.roofline.peaks_run`) names this module for those
request kinds (`deepgap.measure.protocol.register_worker_module`) and never imports it; the worker
process does, on the first such request, so the CLI never touches the GPU.
"""

from __future__ import annotations

from typing import Any

from deepgap.measure.worker import handles
from deepgap.roofline.peaks import PeakMeasurement, PeaksRequest
from deepgap.roofline.peaks_measure import measure_peaks
from deepgap.roofline.profile import ProfileResult, ProfileSpec
from deepgap.roofline.profile_measure import run_profile


@handles("profile")
def handle_profile(state: Any, payload: tuple[ProfileSpec, str | None]) -> ProfileResult:
    """Worker handler ``profile``: `run_profile` in the worker process (the CLI never touches the GPU)."""
    spec, trace_dir = payload
    return run_profile(spec, trace_dir)


@handles("peaks")
def handle_peaks(state: Any, req: PeaksRequest) -> list[PeakMeasurement]:
    """Worker handler ``peaks``: `measure_peaks` on the worker's device, in the worker process."""
    return measure_peaks(state.device, req.size, req.bandwidth_bytes, req.names, req.repeats)
