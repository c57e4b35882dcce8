"""One profiled configuration and what its profile found, as the parent and the store see them.

`deepgap.roofline.profile_measure` runs the profile in the worker process (how, is said there);
`deepgap.roofline.profile_run` is the parent's job that asks for it and stores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepgap.roofline.details import ProfileDetails

if TYPE_CHECKING:
    import pandas as pd

MODES = ("infer", "train")


@dataclass(frozen=True)
class ProfileSpec:
    """One profiled configuration."""

    model: str
    precision: str = "fp32"
    batch_size: int = 64
    mode: str = "infer"  # infer | train
    device: str = "cpu"
    resolution: int | None = None  # None: the model's default
    memory_format: str = "nchw"
    warmup: int = 5
    steps: int = 20
    profiled_steps: int = 1
    lr: float = 0.01
    seed: int = 0

    def label(self) -> str:
        """Short human label."""
        return f"{self.model} {self.mode} {self.precision} bs{self.batch_size}"


@dataclass
class ProfileResult:
    """What one profile found (``kernels``/``clusters`` are per step)."""

    spec: ProfileSpec
    status: str = "ok"  # ok | oom | skipped | error
    reason: str = ""
    resolution: int = 0
    step_times_s: list[float] = field(default_factory=list)
    step_time_median_s: float = float("nan")
    throughput_ips: float = float("nan")
    flops_per_step: float = float("nan")
    bytes_per_step: float = float("nan")  # eager-traffic estimate at the precision
    min_bytes_per_step: float = float("nan")
    achieved_tflops: float = float("nan")
    kernel_time_per_step_s: float = float("nan")
    attributed_flops_per_step: float = float("nan")
    kernels: pd.DataFrame | None = None
    clusters: pd.DataFrame | None = None
    trace_path: str | None = None
    ncu: dict[str, Any] = field(default_factory=dict)
    ncu_kernels: pd.DataFrame | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    details: ProfileDetails = field(default_factory=ProfileDetails)  # stored as ``extra_json``
    started_at: float = 0.0
    duration_s: float = 0.0
