"""A GPU against its host CPU, best against best: the answer's line per model, and ``compare --paper``'s.

Why its own module: Table I's × CPU divides each GPU row by the CPU's row of the same model and precision
(`deepgap.analysis.tables.host_cpu_for`); a reader deciding between the two machines asks something else,
"how much faster, lower-latency and cheaper in energy is the GPU at its best than the CPU at its best". This
module answers that from the same aggregate, per GPU platform and model:

- throughput: the GPU's highest-throughput unflagged configuration over the CPU configuration Table I
  divides it by (`tables.host_cpu_for`: like with like by precision class, int8 over fp8, fp32 over
  fp32; else the CPU's best, labelled "best vs best"), so the answer, Table I, the speedup figure and
  ``compare --paper`` show one number;
- latency at batch 1: each side's lowest median latency at batch 1;
- joules per image: each side's lowest; the CPU's comes from RAPL (`deepgap.measure.telemetry.cpu`) and is
  "unavailable" with the stored reason where the counter was not readable (root-only since Linux 5.10).

The CPU side is the host CPU of the GPU's own run where there is one (the CPU part of a default GPU run,
docs/cpu-baseline.md), else any CPU of the selection. Intervals are `tables.ratio_interval`'s (both sides'
95% CIs); joules per image has no stored CI, so its ratio has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from deepgap.analysis.frame import config_label, is_default_input
from deepgap.analysis.tables import best_rows, clean_cpu, host_cpu_for, ratio_interval
from deepgap.core.result_details import ResultDetails

NAN = float("nan")


@dataclass(frozen=True)
class Ratio:
    """GPU over CPU for one metric ("× faster", "× less energy"), both sides' configurations, or why not."""

    value: float = NAN
    ci_low: float = NAN
    ci_high: float = NAN
    gpu: dict[str, Any] | None = None  # the GPU's configuration (an aggregate row)
    cpu: dict[str, Any] | None = None
    why: str = ""  # "unavailable: …" when there is no ratio
    pairing: str = ""  # "like with like" or "best vs best" (`tables.host_cpu_for`); "" for latency, energy

    @property
    def ok(self) -> bool:
        """Whether there is a number."""
        return self.value == self.value


@dataclass(frozen=True)
class HostCpuLine:
    """One GPU platform and model against its host CPU: throughput, latency at batch 1, joules per image."""

    platform: str
    model: str
    resolution: int
    cpu_platform: str
    throughput: Ratio
    latency_bs1: Ratio
    joules: Ratio


def _num(r: dict[str, Any], k: str) -> float:
    v = r.get(k)
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return NAN
    return f


def _best(rows: pd.DataFrame, col: str, lowest: bool) -> dict[str, Any] | None:
    rows = rows[pd.to_numeric(rows[col], errors="coerce").notna()] if col in rows else rows.iloc[0:0]
    if rows.empty:
        return None
    return rows.sort_values(col, ascending=lowest).iloc[0].to_dict()


def _throughput(gpu: pd.DataFrame, cpu: pd.DataFrame) -> Ratio:
    """The GPU's best over the CPU configuration `host_cpu_for` pairs with it (the one Table I divides by)."""
    g = _best(gpu, "throughput_ips", False)
    c, how = host_cpu_for(g, cpu) if g is not None else (None, "")
    if g is None or c is None:
        return Ratio(gpu=g, cpu=c, why="unavailable: no unflagged throughput on one side")
    return Ratio(*ratio_interval(g, c), gpu=g, cpu=c, pairing=how.split(", ")[0].split(" (")[0])


def _latency(gpu: pd.DataFrame, cpu: pd.DataFrame) -> Ratio:
    g = _best(gpu[gpu["batch_size"] == 1], "latency_median_s", True)
    c = _best(cpu[cpu["batch_size"] == 1], "latency_median_s", True)
    if g is None or c is None:
        side = "the GPU" if g is None else "the CPU"
        return Ratio(gpu=g, cpu=c, why=f"unavailable: {side} has no unflagged batch-1 result")
    lo = _num(c, "latency_median_ci_low_s") / _num(g, "latency_median_ci_high_s")
    hi = _num(c, "latency_median_ci_high_s") / _num(g, "latency_median_ci_low_s")
    return Ratio(_num(c, "latency_median_s") / _num(g, "latency_median_s"), lo, hi, gpu=g, cpu=c)


def energy_reason(df: pd.DataFrame | None, result_ids: list[int]) -> str:
    """Why the CPU's results stored no joules per image (their telemetry's ``energy_source``/``status``)."""
    if df is None or df.empty or "extra" not in df or "result_id" not in df:
        return "unavailable: no CPU energy stored"
    ids = set(int(i) for i in result_ids)
    for rid, extra in zip(df["result_id"], df["extra"], strict=False):
        if int(rid) not in ids:
            continue
        tel = ResultDetails.of(extra).telemetry
        for why in (getattr(tel, "energy_source", None), getattr(tel, "status", None)):
            if isinstance(why, str) and why.startswith("unavailable"):
                return why
    return "unavailable: no CPU energy stored (telemetry off?)"


def _joules(gpu: pd.DataFrame, cpu: pd.DataFrame, df: pd.DataFrame | None) -> Ratio:
    g, c = _best(gpu, "joules_per_image", True), _best(cpu, "joules_per_image", True)
    if c is None:
        ids = [i for ids in cpu.get("result_ids", pd.Series(dtype=object)) for i in (ids or [])]
        return Ratio(gpu=g, why="CPU energy " + energy_reason(df, ids))
    if g is None:
        return Ratio(cpu=c, why="unavailable: the GPU stored no joules per image")
    return Ratio(_num(c, "joules_per_image") / _num(g, "joules_per_image"), gpu=g, cpu=c)


def host_cpu_rows(agg: pd.DataFrame, platform: str, model: str, resolution: Any) -> pd.DataFrame:
    """The unflagged CPU configurations a GPU platform's model is set against: its runs' host CPU first."""
    cpu = clean_cpu(agg)
    if cpu.empty:
        return cpu
    cpu = cpu[(cpu["model"] == model) & (cpu["resolution"] == resolution)]
    mine = agg[(agg["platform"] == platform) & (agg["model"] == model)]
    runs = {r for ids in mine.get("run_ids", []) for r in (ids or [])}
    own = [bool(runs & set(ids or [])) for ids in cpu["run_ids"]] if "run_ids" in cpu and runs else []
    return cpu[own] if any(own) else cpu


def host_cpu_lines(agg: pd.DataFrame, df: pd.DataFrame | None = None) -> list[HostCpuLine]:
    """Per non-CPU platform and model that has a CPU to compare with, the best-vs-best line."""
    if agg.empty:
        return []
    out = []
    # the GPU's answer side: default-input rows only (a resident input is shown beside the answer, not in it)
    gpus = agg[(agg["device"] != "cpu") & ~agg["flagged"].astype(bool) & is_default_input(agg)]
    for (platform, model, res), gpu in gpus.groupby(["platform", "model", "resolution"], sort=True):
        cpu = host_cpu_rows(agg, platform, model, res)
        if cpu.empty:
            continue
        tp = _throughput(gpu, cpu)
        name = str((tp.cpu or cpu.iloc[0].to_dict())["platform"])
        out.append(
            HostCpuLine(
                str(platform), str(model), int(res), name, tp, _latency(gpu, cpu), _joules(gpu, cpu, df)
            )
        )
    return out


def _x(prefix: str, ratio: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip((prefix, f"{prefix}_ci_low", f"{prefix}_ci_high"), ratio, strict=True))


PAPER_COLUMNS = [
    "platform",
    "model",
    "precision",
    "configuration",
    "cpu_configuration",
    "yours_x_cpu_fp32",
    "yours_x_cpu_fp32_ci_low",
    "yours_x_cpu_fp32_ci_high",
    "cpu_same_configuration",
    "yours_x_cpu_same",
    "yours_x_cpu_same_ci_low",
    "yours_x_cpu_same_ci_high",
    "pairing",
    "paper_platform",
    "paper_x_cpu",
    "paper_cpu",
    "yours_over_paper",
]


def paper_cpu_ratios(agg: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Your GPU's peak over your host CPU's beside the paper's T4/L4 over its Xeon, per model and precision.

    The paper's × CPU divides every GPU precision by its Xeon's fp32 (the only precision it ran on the
    CPU), so yours is computed both ways: ``yours_x_cpu_fp32`` the same way as the paper's (comparable with
    it; ``yours_over_paper`` is that over the paper's), and ``yours_x_cpu_same`` the pairing the answer and
    Table I use (`tables.host_cpu_for`: like with like by precision class, else best vs best), named in
    ``pairing``.
    """
    cpu = clean_cpu(agg)
    if agg.empty or cpu.empty:
        return pd.DataFrame(columns=PAPER_COLUMNS)
    is_cpu = paper["platform"].str.contains("Xeon|CPU", case=False, regex=True)
    cpu_name = ", ".join(sorted(map(str, paper.loc[is_cpu, "platform"].unique()))) or "the paper's CPU"
    gpu_paper = paper[paper["speedup_vs_cpu"].notna() & ~is_cpu]
    peaks = best_rows(
        agg[(agg["device"] != "cpu") & ~agg["flagged"].astype(bool) & is_default_input(agg)],
        ["platform", "model", "precision"],
    )
    out = []
    for r in peaks.to_dict("records"):
        fp32, _ = host_cpu_for({**r, "precision": "fp32"}, cpu)
        if fp32 is None:
            continue
        same, how = host_cpu_for(r, cpu)  # the answer's and Table I's pairing
        x32 = ratio_interval(r, fp32)
        xs = ratio_interval(r, same) if same is not None else (NAN, NAN, NAN)
        mine = gpu_paper[(gpu_paper["model"] == r["model"]) & (gpu_paper["precision"] == r["precision"])]
        for p in mine.to_dict("records"):
            out.append(
                {
                    "platform": r["platform"],
                    "model": r["model"],
                    "precision": r["precision"],
                    "configuration": config_label(r),
                    "cpu_configuration": config_label(fp32),
                    **_x("yours_x_cpu_fp32", x32),
                    "cpu_same_configuration": config_label(same) if same is not None else how,
                    "pairing": how.split(", ")[0] if same is not None else how,
                    **_x("yours_x_cpu_same", xs),
                    "paper_platform": p["platform"],
                    "paper_x_cpu": float(p["speedup_vs_cpu"]),
                    "paper_cpu": cpu_name,
                    "yours_over_paper": x32[0] / float(p["speedup_vs_cpu"]),
                }
            )
    return pd.DataFrame(out, columns=PAPER_COLUMNS)
