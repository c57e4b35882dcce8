"""Kernels out of a torch.profiler Chrome trace, tied to the aten ops that launched them.

Why the Chrome trace (``prof.export_chrome_trace``) and not profiler objects: it is the profiler's stable,
documented output, opens in Perfetto, can be saved and re-analysed later, and a small one is a test fixture.

How kernels meet their ops: during a profiled step, `deepgap.measure.models.flops.OpCounter(annotate=True)` runs
each aten op inside ``record_function("dg#<i>")`` and keeps ``records[i]`` (FLOPs, bytes). In the trace, a GPU
kernel (``cat: kernel``, ``gpu_memcpy``, ``gpu_memset``) carries a ``correlation`` id shared with the CUDA
runtime or driver call that launched it (``cuda_runtime``/``cuda_driver``); that call lies, on its host
thread, inside exactly one ``dg#i`` annotation (the counter is not re-entered inside an op, so annotations do
not nest). An op's FLOPs go to its kernels of the compute clusters (convolution, GEMM, attention) in
proportion to their durations (to all its kernels when it has none of those); its bytes and elementwise FLOPs
to all its kernels, by duration. On a CPU there are no kernels: each annotated op that moves data is one unit,
named ``aten::<op>``. Work launched inside torch.optim's ``Optimizer.step`` annotation is clustered as
``optimizer`` whatever its name (on a CPU the update is plain ``add_``/``mul_``).

Saved traces carry the op records under the extra top-level key ``deepgapOps`` (Perfetto ignores it).
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepgap.measure.models.flops import ANNOTATION_PREFIX
from deepgap.roofline.cluster import COMPUTE_CLUSTERS, classify, short_name

if TYPE_CHECKING:
    import pandas as pd

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
OPS_KEY = "deepgapOps"
OPTIMIZER_PREFIX = "Optimizer.step"  # work launched inside it is clustered as "optimizer", whatever its name


@dataclass
class KernelEvent:
    """One kernel launch (or, on a CPU, one op) with what could be attributed to it."""

    name: str
    cluster: str
    ts_us: float
    dur_us: float
    kind: str  # kernel | memcpy | memset | cpu_op
    op_index: int | None = None
    op: str | None = None
    flops: float = float("nan")
    ew_flops: float = float("nan")
    bytes: float = float("nan")


def load_trace(source: str | dict[str, Any]) -> dict[str, Any]:
    """A Chrome trace as a dict, from a path (``.json`` or ``.json.gz``) or an already-loaded dict."""
    if isinstance(source, dict):
        return source
    opener = gzip.open if str(source).endswith(".gz") else open
    with opener(source, "rt") as fh:
        return json.load(fh)


def _annotation_index(
    events: list[dict[str, Any]],
) -> dict[tuple[Any, Any], tuple[list[float], list[tuple[float, int]]]]:
    """Per host thread: sorted annotation starts and (end, op index)."""
    per: dict[tuple[Any, Any], list[tuple[float, float, int]]] = defaultdict(list)
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "user_annotation" and name.startswith(ANNOTATION_PREFIX):
            try:
                idx = int(name[len(ANNOTATION_PREFIX) :])
            except ValueError:
                continue
            ts = float(e["ts"])
            per[(e.get("pid"), e.get("tid"))].append((ts, ts + float(e.get("dur", 0.0)), idx))
    out = {}
    for key, spans in per.items():
        spans.sort()
        out[key] = ([s[0] for s in spans], [(s[1], s[2]) for s in spans])
    return out


def _optimizer_spans(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[tuple[float, float]]]:
    """Per host thread: sorted ``Optimizer.step`` spans (torch.optim's own record_function)."""
    per: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith(OPTIMIZER_PREFIX):
            per[(e.get("pid"), e.get("tid"))].append(
                (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            )
    return {k: sorted(v) for k, v in per.items()}


def _inside(spans, key, ts: float) -> bool:
    lst = spans.get(key, [])
    i = bisect.bisect_right(lst, (ts, float("inf"))) - 1
    return i >= 0 and lst[i][0] <= ts <= lst[i][1]


def _enclosing(index, key, ts: float) -> int | None:
    if key not in index:
        return None
    starts, ends = index[key]
    i = bisect.bisect_right(starts, ts) - 1
    if i >= 0 and ts <= ends[i][0]:
        return ends[i][1]
    return None


def gpu_kernels(trace: dict[str, Any]) -> list[KernelEvent]:
    """Every GPU kernel, memcpy and memset in the trace, with the op index that launched it (if annotated)."""
    events = trace.get("traceEvents", [])
    index = _annotation_index(events)
    opt = _optimizer_spans(events)
    launch: dict[Any, tuple[int | None, bool]] = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {}):
            key, ts = (e.get("pid"), e.get("tid")), float(e["ts"])
            launch[e["args"]["correlation"]] = (_enclosing(index, key, ts), _inside(opt, key, ts))
    out = []
    for e in events:
        kind = GPU_CATEGORIES.get(e.get("cat", ""))
        if kind is None or e.get("ph") != "X":
            continue
        op_index, in_opt = launch.get(e.get("args", {}).get("correlation"), (None, False))
        out.append(
            KernelEvent(
                name=e["name"],
                cluster="optimizer" if in_opt else classify(e["name"]),
                ts_us=float(e["ts"]),
                dur_us=float(e.get("dur", 0.0)),
                kind=kind,
                op_index=op_index,
            )
        )
    return out


def cpu_units(trace: dict[str, Any], records: list[dict[str, Any]]) -> list[KernelEvent]:
    """CPU profiles: each annotated op that moves data, named ``aten::<op>``, with its own FLOPs and bytes."""
    opt = _optimizer_spans(trace.get("traceEvents", []))
    out = []
    for e in trace.get("traceEvents", []):
        name = e.get("name", "")
        if e.get("cat") != "user_annotation" or not name.startswith(ANNOTATION_PREFIX):
            continue
        idx = int(name[len(ANNOTATION_PREFIX) :])
        if idx >= len(records):
            continue
        r = records[idx]
        moved = r["read_bytes"] + r["write_bytes"]
        if moved == 0 and r["flops"] == 0:
            continue  # views and allocations are not work
        op_name = "aten::" + r["op"].split(".")[0]
        in_opt = _inside(opt, (e.get("pid"), e.get("tid")), float(e["ts"]))
        out.append(
            KernelEvent(
                op_name,
                "optimizer" if in_opt else classify(op_name),
                float(e["ts"]),
                float(e.get("dur", 0.0)),
                "cpu_op",
                idx,
                r["op"],
                r["flops"],
                r["ew_flops"],
                moved,
            )
        )
    return out


def attribute(kernels: list[KernelEvent], records: list[dict[str, Any]]) -> None:
    """Share each op's FLOPs and bytes among the kernels it launched (in place; see the module docstring)."""
    by_op: dict[int, list[KernelEvent]] = defaultdict(list)
    for k in kernels:
        if k.op_index is not None and k.op_index < len(records):
            by_op[k.op_index].append(k)
    for idx, ks in by_op.items():
        r = records[idx]
        compute = [k for k in ks if k.cluster in COMPUTE_CLUSTERS] or ks
        _share(compute, "flops", r["flops"])
        for k in ks:
            if k not in compute:
                k.flops = 0.0
        _share(ks, "ew_flops", r["ew_flops"])
        _share(ks, "bytes", r["read_bytes"] + r["write_bytes"])
        for k in ks:
            k.op = r["op"]


def _share(ks: list[KernelEvent], attr: str, total: float) -> None:
    durs = [max(k.dur_us, 0.0) for k in ks]
    whole = sum(durs)
    for k, d in zip(ks, durs, strict=True):
        setattr(k, attr, total * (d / whole if whole > 0 else 1.0 / len(ks)))


def kernels_from_trace(
    source: str | dict[str, Any], records: list[dict[str, Any]] | None = None
) -> list[KernelEvent]:
    """Kernels (GPU) or op units (CPU) of a trace, attributed with ``records`` (default: the trace's own)."""
    trace = load_trace(source)
    recs = records if records is not None else trace.get(OPS_KEY, [])
    kernels = gpu_kernels(trace)
    if not kernels and recs:
        return cpu_units(trace, recs)
    if recs:
        attribute(kernels, recs)
    return kernels


# per-kernel, per-step columns: `kernel_table`'s output and (with profile_id, source, metrics) roofline_kernels
KERNEL_COLUMNS = (
    "name",
    "short_name",
    "cluster",
    "launches_per_step",
    "time_per_step_s",
    "flops_per_step",
    "ew_flops_per_step",
    "bytes_per_step",
    "ops",
)


def kernel_table(kernels: list[KernelEvent], steps: int = 1) -> pd.DataFrame:
    """One row per kernel name (and cluster), per step: launches, time, FLOPs, elementwise FLOPs, bytes."""
    import pandas as pd

    cols = list(KERNEL_COLUMNS)
    if not kernels:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([k.__dict__ for k in kernels])
    g = df.groupby(["name", "cluster"], sort=False)  # one name can be both model and optimizer work
    out = pd.DataFrame(
        {
            "launches_per_step": g.size() / steps,
            "time_per_step_s": g["dur_us"].sum() * 1e-6 / steps,
            "flops_per_step": g["flops"].sum(min_count=1) / steps,
            "ew_flops_per_step": g["ew_flops"].sum(min_count=1) / steps,
            "bytes_per_step": g["bytes"].sum(min_count=1) / steps,
            "ops": g["op"].agg(
                lambda s: ",".join(sorted({x.split(".")[0] for x in s if isinstance(x, str)}))
            ),
        }
    ).reset_index()
    out.insert(1, "short_name", [short_name(n) for n in out["name"]])
    return out.sort_values("time_per_step_s", ascending=False, ignore_index=True)[cols]


def cluster_table(kernel_df: pd.DataFrame) -> pd.DataFrame:
    """Per cluster: kernels, launches, time and its share, FLOPs, bytes, intensity and achieved rates.

    ``intensity_flop_per_byte`` and ``achieved_tflops`` use ``flops + ew_flops`` (so memory-bound clusters,
    whose matmul FLOPs are 0, still have a place on the roofline); ``achieved_tflops_matmul`` uses the
    flop_counter FLOPs only.
    """
    import numpy as np
    import pandas as pd

    if kernel_df is None or len(kernel_df) == 0:
        return pd.DataFrame(
            columns=[
                "cluster",
                "kernels",
                "launches_per_step",
                "time_per_step_s",
                "time_share",
                "flops_per_step",
                "ew_flops_per_step",
                "bytes_per_step",
                "intensity_flop_per_byte",
                "achieved_tflops",
                "achieved_tflops_matmul",
                "bandwidth_gb_s",
            ]
        )
    g = kernel_df.groupby("cluster")
    out = pd.DataFrame(
        {
            "kernels": g.size(),
            "launches_per_step": g["launches_per_step"].sum(),
            "time_per_step_s": g["time_per_step_s"].sum(),
            "flops_per_step": g["flops_per_step"].sum(min_count=1),
            "ew_flops_per_step": g["ew_flops_per_step"].sum(min_count=1),
            "bytes_per_step": g["bytes_per_step"].sum(min_count=1),
        }
    ).reset_index()
    total = out["time_per_step_s"].sum()
    out["time_share"] = out["time_per_step_s"] / total if total > 0 else np.nan
    work = out["flops_per_step"].fillna(0) + out["ew_flops_per_step"].fillna(0)
    work = work.where(out["flops_per_step"].notna() | out["ew_flops_per_step"].notna())
    t = out["time_per_step_s"].replace(0, np.nan)
    out["intensity_flop_per_byte"] = work / out["bytes_per_step"].replace(0, np.nan)
    out["achieved_tflops"] = work / t / 1e12
    out["achieved_tflops_matmul"] = out["flops_per_step"] / t / 1e12
    out["bandwidth_gb_s"] = out["bytes_per_step"] / t / 1e9
    return out.sort_values("time_per_step_s", ascending=False, ignore_index=True)
