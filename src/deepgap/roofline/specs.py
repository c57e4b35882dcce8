"""The packaged spec-sheet table (``data/gpu_specs.csv``) and the paper's rows (``roofline_study.csv``).

Spec numbers are *dense* rates (NVIDIA's sheets print tensor-core rates "with sparsity", twice the dense
rate; the table halves them and says so in ``notes``). ``fp32_tflops`` is the non-tensor FP32 rate (what the
paper calls "Peak TFLOPS"); ``tf32/fp16/bf16/int8/fp8`` are tensor-core rates (int8 in TOPS); empty = the
GPU has no such path; which column holds which precision is the precision table's ``peak_column``
(`deepgap.core.precision`). Bandwidth is GB/s = 1e9 bytes/s. A device name (as torch reports it, e.g.
``NVIDIA H100 80GB HBM3``) is matched against each row's ``match`` regular expression in file order, so
specific variants (H100 PCIe, NVL) precede the generic row.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from deepgap.core.precision import PRECISIONS

if TYPE_CHECKING:
    import pandas as pd

SPEC_FILE = "gpu_specs.csv"
STUDY_FILE = "roofline_study.csv"
BANDWIDTH_COLUMN = "memory_bandwidth_gb_s"  # the peak named ``memory`` (a precision's is in its table entry)


def peak_column(name: str) -> str | None:
    """The spec-sheet column of peak ``name`` (a precision, or ``memory``), None for an unknown name."""
    if name == "memory":
        return BANDWIDTH_COLUMN
    p = PRECISIONS.get(name)
    return p.peak_column if p else None


def _data_path(name: str) -> str:
    from importlib.resources import files

    return str(files("deepgap") / "data" / name)


@functools.lru_cache(maxsize=1)
def _load_specs_cached() -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(_data_path(SPEC_FILE), dtype={"compute_capability": str})


def load_specs() -> pd.DataFrame:
    """The spec-sheet table as a DataFrame (a copy)."""
    return _load_specs_cached().copy()


def spec_for(device_name: str | None) -> dict[str, Any] | None:
    """The spec row whose ``match`` pattern occurs in ``device_name`` (first in file order), or None.

    A copy of a row looked up once per device name: the report asks once per result row (hundreds of
    times), and scanning the table with ``iterrows`` each time cost its build seconds.
    """
    if not device_name:
        return None
    row = _spec_row_cached(device_name)
    return dict(row) if row is not None else None


@functools.lru_cache(maxsize=64)
def _spec_row_cached(device_name: str) -> dict[str, Any] | None:
    for _, row in _load_specs_cached().iterrows():
        if re.search(str(row["match"]), device_name, re.IGNORECASE):
            return row.to_dict()
    return None


def spec_by_gpu(gpu: str) -> dict[str, Any] | None:
    """The spec row named exactly ``gpu`` (e.g. ``NVIDIA T4``), or by pattern when no name matches."""
    df = _load_specs_cached()
    hit = df[df["gpu"].str.lower() == gpu.lower()]
    return hit.iloc[0].to_dict() if len(hit) else spec_for(gpu)


def spec_peak(row: dict[str, Any] | None, name: str) -> float | None:
    """A row's peak for ``name`` (a precision, or ``memory`` for GB/s); None when absent or empty."""
    col = peak_column(name)
    if row is None or col is None:
        return None
    v = row.get(col)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if v != v else v


def load_study() -> pd.DataFrame:
    """The paper's per-step numbers, with what follows from them.

    Added columns: ``theoretical_time_s_recomputed`` (the paper's eq. 6, FLOPs / peak: the printed values are
    1000× too large — 270 GFLOP / 8.1 TFLOP/s is 33 ms, not 33 s); ``implied_gflop_per_step`` (GFLOP/s × time:
    the FLOPs its ncu counters saw per step); ``implied_gflop_per_image``.
    """
    import pandas as pd

    df = pd.read_csv(_data_path(STUDY_FILE))
    df["theoretical_time_s_recomputed"] = df["step_gflop_reported"] * 1e9 / (df["peak_fp32_tflops"] * 1e12)
    df["implied_gflop_per_step"] = df["gflop_s"] * df["measured_time_s"]
    df["implied_gflop_per_image"] = df["implied_gflop_per_step"] / df["batch_size"]
    return df
