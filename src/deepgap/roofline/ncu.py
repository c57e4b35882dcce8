"""Nsight Compute (``ncu``): the paper's hardware counters, collected and parsed into the store.

The paper ran ``ncu`` over 4 training steps with instruction counters per precision (``fadd``, ``fmul``,
``ffma`` for fp32; ``h*`` for fp16; ``d*`` for fp64), DRAM bytes read/written and the GPU time, summed them
over kernels and applied (per step = ÷ steps):

- time (s) = Σ gpu__time_duration (ns) / (1e9 · steps)                                         (1)
- DRAM (GB/s) = (Σ dram read + write bytes) / (1e9 · steps · time)                              (2)
- FLOPs = (Σ fadd + Σ fmul + 2 · Σ ffma) / steps                                               (3)
- GFLOP/s = FLOPs / (1e9 · time);  intensity (FLOP/byte) = GFLOP/s / DRAM                      (4), (5)

Caveat the paper missed: these counters count CUDA-core instructions only. Tensor-core work (every TF32,
FP16 or BF16 convolution/GEMM on Ampere and later — PyTorch lets cuDNN use TF32 by default) is invisible
to them, which is why the paper's L4 ResNet-50 step "did" 195 GFLOP while T4 and V100 did ~1,226. deepgap
therefore also asks for tensor-pipe counters where this ncu has them (``sm__inst_executed_pipe_tensor``,
``sm__ops_path_tensor_src_*``) and reports them raw, beside the paper's FLOPs, never folded into them.

The profiled process is ``python -m deepgap.roofline.ncu_child …``: it warms up, then brackets the
profiled steps with ``cudaProfilerStart``/``Stop`` (``ncu --profile-from-start off``), so warm-up and
cuDNN autotuning are not profiled. Output: ``--csv --page raw --print-units base`` into a log file.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from deepgap.roofline.profile import ProfileSpec

_OPS = ("fadd", "fmul", "ffma", "hadd", "hmul", "hfma", "dadd", "dmul", "dfma")
INST_METRICS = tuple(f"smsp__sass_thread_inst_executed_op_{o}_pred_on.sum" for o in _OPS)
PAPER_METRICS = INST_METRICS + ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
TENSOR_METRICS = (
    "sm__inst_executed_pipe_tensor.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16_dst_fp16.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
)
_UNIT_SCALE = {  # to bytes and nanoseconds (the paper's formulas expect ns)
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
}
_ID_COLUMNS = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Kernel Time",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
    "Section Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
)


def find_ncu() -> str | None:
    """Path of the ``ncu`` executable: PATH, then the usual CUDA and Nsight Compute install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in (
        "/usr/local/cuda/bin/ncu",
        "/usr/local/cuda-*/bin/ncu",
        "/opt/nvidia/nsight-compute/*/ncu",
    ):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def available_metrics(ncu: str, timeout_s: float = 120) -> set[str] | None:
    """Base metric names this ncu offers for the present GPU (None if the query fails)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    names = set(re.findall(r"^([a-z0-9]+__[A-Za-z0-9_]+)", out.stdout, re.MULTILINE))
    return names or None


def select_metrics(available: set[str] | None, tensor: bool = True) -> list[str]:
    """The paper's metrics, plus the tensor-pipe ones this ncu knows (all the paper's metrics if unknown)."""
    metrics = list(PAPER_METRICS)
    if tensor and available:
        metrics += [m for m in TENSOR_METRICS if m.rsplit(".", 1)[0] in available]
    return metrics


def _number(text: str, unit: str = "") -> float:
    t = (text or "").strip().replace(",", "")
    if t == "" or t.lower() in ("n/a", "nan", "(!) n/a"):
        return float("nan")
    try:
        v = float(t)
    except ValueError:
        return float("nan")
    return v * _UNIT_SCALE.get(unit.strip().lower(), 1.0)


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """Parse ncu CSV (``--page raw`` wide, or the default ``details`` long format): one row per kernel launch.

    Columns: ``id``, ``kernel_name``, ``block_size``, ``grid_size`` and one float column per metric, in base
    units (bytes, nanoseconds, counts). Lines ncu writes around the table (``==PROF==``, warnings) are
    skipped;
    thousands separators (``1,234``) and scaled units (``Mbyte``, ``usecond``) are handled.
    """
    import pandas as pd

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        return pd.DataFrame(columns=["id", "kernel_name"])
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    if "Metric Name" in col and "Metric Value" in col:  # long format: one metric per row
        launches: dict[str, dict[str, Any]] = {}
        for r in rows[1:]:
            if len(r) < len(header):
                continue
            d = launches.setdefault(
                r[col["ID"]],
                {
                    "id": int(r[col["ID"]]),
                    "kernel_name": r[col["Kernel Name"]],
                    "block_size": r[col["Block Size"]] if "Block Size" in col else "",
                    "grid_size": r[col["Grid Size"]] if "Grid Size" in col else "",
                },
            )
            unit = r[col["Metric Unit"]] if "Metric Unit" in col else ""
            d[r[col["Metric Name"]]] = _number(r[col["Metric Value"]], unit)
        return pd.DataFrame(list(launches.values()))
    body = rows[1:]
    units = [""] * len(header)
    if body and body[0][col["ID"]].strip() == "":  # the raw page's units row
        units, body = body[0], body[1:]
    metrics = [(i, h) for i, h in enumerate(header) if h not in _ID_COLUMNS]
    recs = []
    for r in body:
        if len(r) < len(header):
            continue
        d: dict[str, Any] = {
            "id": int(r[col["ID"]]),
            "kernel_name": r[col["Kernel Name"]],
            "block_size": r[col["Block Size"]] if "Block Size" in col else "",
            "grid_size": r[col["Grid Size"]] if "Grid Size" in col else "",
        }
        for i, h in metrics:
            d[h] = _number(r[i], units[i] if i < len(units) else "")
        recs.append(d)
    return pd.DataFrame(recs)


def _col(df: pd.DataFrame, name: str):
    import numpy as np

    return df[name].fillna(0.0) if name in df else np.zeros(len(df))


def paper_summary(df: pd.DataFrame, steps: int = 1) -> dict[str, float]:
    """The paper's formulas (1)–(5) over all launches, per step, plus fp16/fp64 FLOPs and tensor counters."""
    time_s = float(_col(df, "gpu__time_duration.sum").sum()) / (1e9 * steps)
    dram = float(_col(df, "dram__bytes_read.sum").sum() + _col(df, "dram__bytes_write.sum").sum())
    out = {
        "steps": steps,
        "launches_per_step": len(df) / steps,
        "time_s": time_s,
        "dram_bytes_per_step": dram / steps,
        "dram_gb_s": dram / (1e9 * steps * time_s) if time_s else float("nan"),
    }
    for prec, p in (("fp32", "f"), ("fp16", "h"), ("fp64", "d")):
        op = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
        flops = (
            float(
                _col(df, op.format(p + "add")).sum()
                + _col(df, op.format(p + "mul")).sum()
                + 2 * _col(df, op.format(p + "fma")).sum()
            )
            / steps
        )
        out[f"{prec}_flops_per_step"] = flops
        out[f"{prec}_gflop_s"] = flops / (1e9 * time_s) if time_s else float("nan")
    out["flops_per_step"] = out["fp32_flops_per_step"]  # the paper's eq. (3): fp32 only
    out["gflop_s"] = out["fp32_gflop_s"]
    out["intensity_flop_per_byte"] = out["gflop_s"] / out["dram_gb_s"] if out["dram_gb_s"] else float("nan")
    for m in TENSOR_METRICS:
        if m in df:
            out[m + "_per_step"] = float(df[m].fillna(0).sum()) / steps
    return out


def kernel_metrics_table(df: pd.DataFrame, steps: int = 1) -> pd.DataFrame:
    """Per kernel name, per step: cluster, launches, time, CUDA-core FLOPs (all precisions), DRAM bytes."""
    import pandas as pd

    from deepgap.roofline.cluster import classify, short_name
    from deepgap.roofline.trace import KERNEL_COLUMNS

    if df is None or len(df) == 0:  # the trace's per-kernel columns, less what ncu does not split out
        return pd.DataFrame(columns=[c for c in KERNEL_COLUMNS if c not in ("ew_flops_per_step", "ops")])
    op = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
    work = pd.DataFrame(
        {
            "name": df["kernel_name"],
            "time_ns": _col(df, "gpu__time_duration.sum"),
            "flops": sum(
                _col(df, op.format(p + "add"))
                + _col(df, op.format(p + "mul"))
                + 2 * _col(df, op.format(p + "fma"))
                for p in "fhd"
            ),
            "bytes": _col(df, "dram__bytes_read.sum") + _col(df, "dram__bytes_write.sum"),
        }
    )
    extra = [m for m in df.columns if m not in ("id", "kernel_name", "block_size", "grid_size")]
    for m in extra:
        work[m] = df[m].fillna(0.0)
    g = work.groupby("name", sort=False)
    out = pd.DataFrame({"name": list(g.groups)})
    out["short_name"] = [short_name(n) for n in out["name"]]
    out["cluster"] = [classify(n) for n in out["name"]]
    out["launches_per_step"] = g.size().values / steps
    out["time_per_step_s"] = g["time_ns"].sum().values * 1e-9 / steps
    out["flops_per_step"] = g["flops"].sum().values / steps
    out["bytes_per_step"] = g["bytes"].sum().values / steps
    out["metrics"] = [
        {m: float(v) / steps for m, v in row.items()} for row in g[extra].sum().to_dict("records")
    ]
    return out.sort_values("time_per_step_s", ascending=False, ignore_index=True)


@dataclass
class NcuOutcome:
    """What an ncu collection produced, or why it could not run."""

    status: str  # ok | unavailable | error
    reason: str = ""
    command: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    kernels: pd.DataFrame | None = None
    csv_path: str | None = None


def child_argv(spec: ProfileSpec) -> list[str]:
    """The profiled child process: the same step as `deepgap.roofline.profile_measure.build_step` builds."""
    flags = {
        "--model": spec.model, "--precision": spec.precision, "--batch-size": spec.batch_size,
        "--mode": spec.mode, "--device": spec.device, "--resolution": spec.resolution or 0,
        "--memory-format": spec.memory_format, "--warmup": spec.warmup, "--steps": spec.profiled_steps,
        "--seed": spec.seed,
    }  # fmt: skip
    argv = [str(x) for kv in flags.items() for x in kv]
    return [sys.executable, "-m", "deepgap.roofline.ncu_child", *argv]


def build_command(
    ncu: str, argv: list[str], metrics: list[str], log_file: str, launch_count: int = 0
) -> list[str]:
    """The ncu command line (CSV raw page, base units, profiling only between cudaProfilerStart/Stop)."""
    cmd = [
        ncu,
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--profile-from-start",
        "off",
        "--target-processes",
        "all",
        "--metrics",
        ",".join(metrics),
        "--log-file",
        log_file,
    ]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    return cmd + argv


def run_ncu(
    spec: ProfileSpec, out_dir: str, launch_count: int = 0, timeout_s: float = 300, ncu: str | None = None
) -> NcuOutcome:
    """Collect the paper's metrics over ``spec.profiled_steps`` steps in a child process, and parse them."""
    ncu = ncu or find_ncu()
    if ncu is None:
        return NcuOutcome(
            "unavailable",
            "unavailable: ncu (Nsight Compute CLI) was not found on PATH, in "
            "/usr/local/cuda*/bin or /opt/nvidia/nsight-compute; install Nsight Compute to collect "
            "hardware counters (the torch.profiler breakdown does not need it)",
        )
    if not spec.device.startswith("cuda"):
        return NcuOutcome("unavailable", "unavailable: ncu profiles CUDA kernels; this profile ran on a CPU")
    metrics = select_metrics(available_metrics(ncu))
    os.makedirs(out_dir, exist_ok=True)
    log = os.path.join(out_dir, f"ncu-{spec.model}-{spec.mode}-{spec.precision}-bs{spec.batch_size}.csv")
    cmd = build_command(ncu, child_argv(spec), metrics, log, launch_count)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return NcuOutcome(
            "error", f"ncu ran past {timeout_s:.0f} s; pass a smaller --ncu-launch-count", cmd, metrics
        )
    text = ""
    if os.path.exists(log):
        with open(log) as fh:
            text = fh.read()
    output = proc.stdout + proc.stderr + text
    if "ERR_NVGPUCTRPERM" in output:
        return NcuOutcome(
            "unavailable",
            "unavailable: GPU performance counters are restricted to admin users "
            "(ERR_NVGPUCTRPERM); run as root or allow them (NVreg_RestrictProfilingToAdminUsers=0)",
            cmd,
            metrics,
        )
    df = parse_ncu_csv(text)
    if proc.returncode != 0 or len(df) == 0:
        tail = " | ".join(ln for ln in output.strip().splitlines()[-3:])
        return NcuOutcome(
            "error", f"ncu exited {proc.returncode} with {len(df)} kernels: {tail}"[:500], cmd, metrics
        )
    steps = max(spec.profiled_steps, 1)
    return NcuOutcome("ok", "", cmd, metrics, paper_summary(df, steps), kernel_metrics_table(df, steps), log)
