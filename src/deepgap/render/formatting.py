"""Formatting of the report's tables: units for people (ms, GiB, ×), one column spec per table.

Used by `deepgap.report.page` (HTML) and the ``compare``/``recommend`` commands (terminal). Formatting only:
the numbers come from `deepgap.analysis`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from deepgap.render.units import columns, of_frame


# --- formatting (no arithmetic beyond unit conversion) ------------------------------------------
def _ok(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def fmt_ips(v: Any) -> str:
    """Images per second."""
    return f"{float(v):,.1f}" if _ok(v) else "–"


def fmt_tokens(r: dict[str, Any]) -> str:
    """A text model's tokens/s with its sequence length, '123,456.0 at seq 128'; '' for an image model.

    A mixed-length batch's real tokens are its mean length: '123,456.0 at mean length 177.3 of seq 384'.
    """
    seq = r.get("seq_len")
    if not _ok(seq) or not float(seq) > 0:
        return ""
    real = r.get("tokens_per_sample")
    mean = f"mean length {float(real):.1f} of " if _ok(real) and float(real) > 0 else ""
    return f"{fmt_ips(r.get('tokens_per_s'))} at {mean}seq {int(seq)}"


def fmt_ms(v: Any) -> str:
    """Seconds shown as milliseconds: 3 significant digits, never in exponent form (1004.7 ms read "1e+03")."""
    ms = float(v) * 1e3 if _ok(v) else math.nan
    return "–" if ms != ms else f"{ms:,.0f}" if abs(ms) >= 999.5 else f"{ms:.3g}"


def fmt_capacity(qps: Any) -> str:
    """A capacity, or a dash where no rate passed (it printed 0.0, never measured; the row's why says more)."""
    return f"{float(qps):,.1f}" if _ok(qps) and float(qps) > 0 else "–"


def fmt_x(v: Any) -> str:
    """A ratio as ``2.31×``, ``23.1×`` or ``118×`` (three significant digits, never ``118.×``)."""
    if not _ok(v):
        return "–"
    f = float(v)
    return f"{f:,.0f}×" if abs(f) >= 99.95 else f"{f:#.3g}×"


def fmt_tail(r: dict[str, Any]) -> str:
    """A latency tail with what it is: '1.23 (max of n=20)' or '0.98 (p99 of n=400)' (`analysis.tails`).

    Why not a bare "P99" column: the default presets time 8–40 calls per configuration, too few for a
    p99 (it needs ≥ 368), and their stored "p99" is then the sample maximum in all but name.
    """
    s, name = r.get("latency_tail_s"), r.get("latency_tail_name")
    if not _ok(s):
        return "–"
    return f"{fmt_ms(s)} ({name})" if name else fmt_ms(s)


def fmt_gib(v: Any) -> str:
    """Bytes as GiB."""
    return f"{float(v) / 2**30:.3g}" if _ok(v) else "–"


def fmt_num(v: Any, spec: str = ".3g") -> str:
    """Any number, or a dash."""
    return format(float(v), spec) if _ok(v) else "–"


def num_cell(col: str, spec: str = ".3g", scale: float = 1.0, suffix: str = "") -> Callable[[Any], str]:
    """A table column: the row's ``col`` × ``scale`` as ``spec`` and ``suffix`` (a dash alone where it is missing)."""
    return lambda r: (
        t if (t := fmt_num(None if r.get(col) is None else r.get(col) * scale, spec)) == "–" else t + suffix
    )


def pct_cell(col: str, spec: str = ".0f") -> Callable[[Any], str]:
    """A table column: the row's share ``col`` (0–1) as a percentage."""
    return num_cell(col, spec, 100, "%")


def fmt_ci(lo: Any, hi: Any, f=fmt_ips) -> str:
    """A 95% CI as ``[lo, hi]``."""
    return f"[{f(lo)}, {f(hi)}]" if _ok(lo) and _ok(hi) else "–"


def _cpu_ci(r: dict[str, Any]) -> str:
    """The × CPU ratio's interval (`analysis.tables.ratio_interval`)."""
    return fmt_ci(r.get("speedup_vs_cpu_ci_low"), r.get("speedup_vs_cpu_ci_high"), fmt_x)


def _threads(v: Any) -> str:
    return str(int(v)) if _ok(v) and int(v) > 0 else "default"


def fmt_list(v: Any) -> str:
    """A list as comma-separated text."""
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else ("" if v is None or v != v else str(v))


# --- tables: (header, cell) columns per table -------------------------------------------------
Col = tuple[str, Any]
CONFIG_COLUMNS: list[Col] = [
    ("platform", "platform"),
    ("model", "model"),
    ("engine", lambda r: input_cell(r["engine"], r)),  # "quant · int8-resident": never read as the default
    ("precision", "precision"),
    ("batch", "batch_size"),
    ("format", "memory_format"),
    ("threads", lambda r: _threads(r["threads"])),
    ("px", "resolution"),
]
FLAG_COLUMNS: list[Col] = [
    ("flags", lambda r: fmt_list(r.get("flags"))),
    ("warnings", lambda r: fmt_list(r.get("warnings"))),
]


def spread_text(r: dict[str, Any]) -> str:
    """'±1.2% over 2 (1,010 / 1,030)': the sweeps' coefficient of variation and their throughputs."""
    cv, vals = r.get("between_sweep_cv"), r.get("sweep_throughputs")
    if not isinstance(vals, list) or len(vals) < 2 or cv is None or cv != cv:
        return ""
    return f"±{100 * cv:.1f}% over {len(vals)} ({' / '.join(fmt_ips(v) for v in vals)})"


TABLE_SPECS: dict[str, tuple[str, list[Col]]] = {
    "table1_peak_throughput": (
        "Table I — peak throughput per platform, model and precision",
        [
            ("platform", "platform"),
            ("model", "model"),
            ("precision", lambda r: input_cell(r["precision"], r)),  # a resident input's own row, said so
            ("peak batch", "batch_size"),
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("95% CI", lambda r: fmt_ci(r["throughput_ci_low_ips"], r["throughput_ci_high_ips"])),
            ("tokens/s", fmt_tokens),
            ("pipelined images/s", lambda r: fmt_ips(r["throughput_pipelined_ips"])),
            ("median ms", lambda r: fmt_ms(r["latency_median_s"])),
            ("tail ms", fmt_tail),
            ("measurements", "n_measurements"),
            ("runs", "n_runs"),
            ("TFLOPS", lambda r: fmt_num(r["achieved_tflops"])),
            ("× CPU", lambda r: fmt_x(r["speedup_vs_cpu"])),
            ("× CPU 95% CI", lambda r: _cpu_ci(r)),
            ("configuration", "configuration"),
            ("CPU baseline", "cpu_baseline"),
            ("run ids", lambda r: fmt_list(r["run_ids"])),
            *FLAG_COLUMNS,
        ],
    ),
    "paper_comparison": (
        "Your peaks beside the paper's Table I (T4, L4, Xeon 6)",
        [
            ("your platform", "platform"),
            ("model", "model"),
            ("precision", "precision"),
            ("paper precision", lambda r: r.get("paper_precision", r["precision"])),  # tf32 ↔ the L4's "FP32"
            ("your configuration", "configuration"),
            ("your images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("paper platform", "paper_platform"),
            ("paper engine", "paper_engine"),
            ("paper batch", "paper_batch"),
            ("paper images/s", lambda r: fmt_ips(r["paper_images_per_s"])),
            ("yours / paper", lambda r: fmt_x(r["ratio_vs_paper"])),
            ("95% CI (yours only)", lambda r: fmt_ci(r["ratio_ci_low"], r["ratio_ci_high"], fmt_x)),
            *FLAG_COLUMNS,
        ],
    ),
    "speedup_vs_cpu": (
        "Speedup over the CPU (peak vs the CPU's best of the same model and precision, else its fp32)",
        [
            ("platform", "platform"),
            ("model", "model"),
            ("precision", lambda r: input_cell(r["precision"], r)),
            ("configuration", "configuration"),
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("CPU configuration", "cpu_configuration"),
            ("CPU images/s", lambda r: fmt_ips(r["cpu_throughput_ips"])),
            ("× CPU", lambda r: fmt_x(r["speedup_vs_cpu"])),
            ("95% CI", lambda r: _cpu_ci(r)),
            ("CPU side", lambda r: r.get("cpu_match", "")),
            *FLAG_COLUMNS,
        ],
    ),
    "speedup_vs_fp32": (
        "Speedup over FP32 at each batch (fig. 11)",
        [
            *CONFIG_COLUMNS,
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("FP32 engine", "baseline_engine"),
            ("FP32 images/s", lambda r: fmt_ips(r["baseline_throughput_ips"])),
            ("× FP32", lambda r: fmt_x(r["speedup"])),
            *FLAG_COLUMNS,
        ],
    ),
    "pareto_frontier": (
        "Latency–throughput Pareto frontier (fig. 10)",
        [
            *CONFIG_COLUMNS,
            ("median ms", lambda r: fmt_ms(r["latency_median_s"])),
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            *FLAG_COLUMNS,
        ],
    ),
    "energy": (
        "Energy: perf-per-watt and joules per image",
        [
            *CONFIG_COLUMNS,
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("mean W", lambda r: fmt_num(r.get("mean_power_w"))),
            ("images/s/W", lambda r: fmt_num(r.get("ips_per_watt"))),
            ("mJ/image", lambda r: fmt_num(r.get("joules_per_image", float("nan")) * 1e3)),
            ("max °C", lambda r: fmt_num(r.get("max_temp_c"))),
            *FLAG_COLUMNS,
        ],
    ),
    "cpu_thread_scaling": (
        "CPU thread scaling",
        [
            ("platform", "platform"),
            ("model", "model"),
            ("engine", "engine"),
            ("precision", "precision"),
            ("batch", "batch_size"),
            ("threads", "threads"),
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("× fewest threads", lambda r: fmt_x(r["speedup_vs_min_threads"])),
            ("parallel efficiency", lambda r: fmt_num(r["parallel_efficiency"], ".0%")),
            *FLAG_COLUMNS,
        ],
    ),
    "configurations": (
        "Every configuration (sweep passes and runs folded)",
        [
            *CONFIG_COLUMNS,
            ("images/s", lambda r: fmt_ips(r["throughput_ips"])),
            ("95% CI", lambda r: fmt_ci(r["throughput_ci_low_ips"], r["throughput_ci_high_ips"])),
            ("pipelined", lambda r: fmt_ips(r["throughput_pipelined_ips"])),
            ("median ms", lambda r: fmt_ms(r["latency_median_s"])),
            ("tail ms", fmt_tail),
            ("NVML GiB", lambda r: fmt_gib(r["device_mem_used_bytes"])),
            ("reserved GiB", lambda r: fmt_gib(r["peak_mem_reserved_bytes"])),
            ("allocated GiB", lambda r: fmt_gib(r["peak_mem_allocated_bytes"])),
            ("host RSS GiB", lambda r: fmt_gib(r["host_rss_bytes"])),
            ("n", "n_measurements"),
            ("between sweeps", lambda r: spread_text(r)),
            (
                "flagged measurements left out",
                lambda r: (
                    f"{int(r['n_excluded'])} ({fmt_list(r['excluded_flags'])})"
                    if r.get("n_excluded")
                    else "0"
                ),
            ),
            ("CI method", "ci_method"),
            *FLAG_COLUMNS,
        ],
    ),
    "failures": (
        "Configurations without a number (OOM, skipped, errors)",
        [*CONFIG_COLUMNS, ("status", "status"), ("reason", "reason"), ("run", "run_id")],
    ),
    "thermal_state": (
        "Thermal steady state per run (the paper measures at steady state; rows measured while the "
        "temperature still rose keep their numbers and the temp-rising warning)",
        [
            ("run", "run_id"),
            ("platform", "platform"),
            ("thermal warm-up", "warm_up"),
            ("measurements", "measurements"),
            ("measured while warming (temp-rising)", "temp_rising"),
        ],
    ),
}


FILTER_KEYS = {"model": "model", "engine": "engine", "precision": "precision", "batch": "batch_size"}


def _cell(row: dict[str, Any], spec: Any) -> str:
    v = spec(row) if callable(spec) else row.get(spec)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def html_table(name: str, frame: pd.DataFrame, spec: tuple[str, list[Col]] | None = None) -> dict[str, Any]:
    """A table as header and formatted cells; flagged rows and warnings carry CSS classes.

    ``spec``: its title and columns (default: the core table of that name in `TABLE_SPECS`).
    """
    title, cols = spec if spec is not None else TABLE_SPECS[name]
    units = of_frame(frame)  # a text model's table says seq/s, mJ/sequence, seq len (render.units)
    cols, title = columns(cols, units), units.header(title)
    rows = []
    for r in frame.to_dict("records"):
        rows.append(
            {
                "cells": [_cell(r, spec) for _, spec in cols],
                "flagged": bool(r.get("flagged")),
                "warned": bool(r.get("warnings")),
                "data": {k: str(_cell(r, c)) for k, c in FILTER_KEYS.items() if r.get(c) is not None},
            }
        )
    return {
        "name": name,
        "title": title,
        "headers": [h for h, _ in cols],
        "rows": rows,
        "flag_col": [h for h, _ in cols].index("flags") if "flags" in [h for h, _ in cols] else -1,
        "warn_col": [h for h, _ in cols].index("warnings") if "warnings" in [h for h, _ in cols] else -1,
    }


def env_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    """Everything stored about a run (its row, environment and sweep) as (key, text) pairs."""

    def fmt(v: Any) -> str:  # a missing value is a dash, never the text "None"
        return json.dumps(v) if isinstance(v, (dict, list)) else "–" if v is None else str(v)

    rows = [
        ("run id", run["run_id"]),
        ("status", run["status"]),
        ("command", run["command"]),
        ("started", _dt.datetime.fromtimestamp(run["created_at"]).isoformat(timespec="seconds")),
        ("host", run["host"]),
        ("deepgap", run["deepgap_version"]),
    ]
    rows += [(f"env: {k}", fmt(v)) for k, v in sorted(run["env"].items())]
    rows += [(f"sweep: {k}", fmt(v)) for k, v in sorted(run["spec"].items())]
    return rows


ENV_SUMMARY = [
    "run",
    "device_name",
    "driver",
    "torch",
    "torch_cuda",
    "cudnn",
    "python",
    "os",
    "cpu_model",
    "host",
    "command",
]


def without_default_inputs(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its ``input_mode`` column where every row has the default input ("").

    Why: the column names a resident input (`deepgap.core.records.INPUT_MODES`); a selection of default
    rows only is written as it was before the input axis existed (same columns, byte for byte), and a
    selection with a resident row has the column, empty for its default rows.
    """
    if "input_mode" in frame and not any(isinstance(v, str) and v for v in frame["input_mode"]):
        return frame.drop(columns="input_mode")
    return frame


def input_cell(value: Any, r: dict[str, Any]) -> str:
    """A table cell with the row's input mode beside it (``int8 · int8-resident``), if not the default."""
    mode = r.get("input_mode")
    return f"{value} · {mode}" if isinstance(mode, str) and mode else str(value)


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame ready for CSV: list cells joined with ``;``, dict cells as JSON; no all-default input column."""
    out = without_default_inputs(frame).copy()
    for c in out.columns:
        if out[c].map(lambda v: isinstance(v, (list, tuple, dict))).any():
            out[c] = out[c].map(
                lambda v: (
                    ";".join(map(str, v))
                    if isinstance(v, (list, tuple))
                    else json.dumps(v)
                    if isinstance(v, dict)
                    else v
                )
            )
    return out
