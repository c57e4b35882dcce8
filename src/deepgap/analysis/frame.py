"""From stored measurements to configurations: flags, and the aggregate every table and figure reads.

A *measurement* is one row of `Store.results_frame` (one configuration of one sweep pass of one
run). A *configuration* is a measurement without its sweep pass and run: the same platform
(``device_name``), model, engine, precision, batch size, device, memory format, threads,
resolution, transfer setting and input mode. The paper repeats its batch sweep ten times; `aggregate` folds
those passes (and repeated runs) into one row per configuration:

- throughput and median latency: the median over measurements (one measurement: its own value);
- 95% CI: one measurement → its stored bootstrap CI; three or more → a bootstrap CI of the median
  over the per-measurement values (run-to-run spread); two → the envelope of both stored CIs;
- median, p5 and P99 latency: from one distribution, the pooled per-call samples of every measurement
  where they are stored (else the median over measurements of each), so p5 ≤ median ≤ P99; memory: the
  maximum over measurements (the paper keeps the worst repeat); the tail every view prints and a
  constraint checks is ``latency_tail_s``: a P99 only where n supports one, else the maximum of all
  samples, labelled "max of n=…" (``latency_tail_name``, `analysis.tails`).

Measurements with a disqualifying flag (wrong outputs, telemetry contamination) are left out of a
configuration's numbers and counted in ``n_excluded``; a configuration whose every measurement is
flagged keeps its numbers but is ``flagged`` and never recommended. A missed adaptive CI target
(``ci_met == 0``) is a warning only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis import accuracy, cards, hosts, signals, sweeps, tails, tokens
from deepgap.analysis.flags import (
    TELEMETRY_MAX,
    TELEMETRY_MEDIAN,
    row_flags,
    row_warnings,
    telemetry_of,
)
from deepgap.core.guards import rate_flag
from deepgap.core.records import input_kind, input_mode_label, input_name
from deepgap.core.result_details import ResultDetails, real_tokens
from deepgap.core.stats import bootstrap_ci
from deepgap.core.stats import finite_or_none as _num

# A configuration is a ConfigSpec without its sweep pass, on one platform.
CONFIG_COLS = [
    "model",
    "engine",
    "precision",
    "batch_size",
    "device",
    "memory_format",
    "threads",
    "resolution",
    "include_transfer",
    "seq_len",  # a text model's sequence length; 0 = not applicable (an image model)
    "input_mode",  # "" = the default input; "int8-resident" (core.records.INPUT_MODES): never pooled with it
]
GROUP_COLS = ["platform", *CONFIG_COLS]
# The order the views show a configuration in, before their batch size and figures.
CONFIG_VIEW_COLS = [
    "platform",
    "device",
    "model",
    "engine",
    "precision",
    "memory_format",
    "threads",
    "resolution",
]
MEMORY_COLS = [
    "peak_mem_allocated_bytes",
    "peak_mem_reserved_bytes",
    "device_mem_used_bytes",
    "host_rss_bytes",
]
# extra["telemetry"] aggregates (written by the telemetry layer); all optional.
MEMORY_LABELS = {
    "device_mem_used_bytes": "device-wide peak used while timing (NVML, sampled; the paper's way)",
    "peak_mem_reserved_bytes": "process peak reserved while timing (torch allocator)",
    "peak_mem_allocated_bytes": "process peak allocated while timing (torch tensors)",
    "host_rss_bytes": "host RSS (CPU process)",
}


# Accuracy against the fp32 eager reference (deepgap.measure.correctness, stored in extra["correctness"]): the
# evidence a quantized row carries wherever it is shown. Aggregated as the worst over measurements.
ACCURACY_WORST = {"rel_l2": "max", "cosine": "min", "top1_agreement": "min"}
# every column `aggregate` takes a median, maximum or minimum of (`_Numbers`)
NUMBER_COLS = [
    "throughput_ips",
    "throughput_pipelined_ips",
    "latency_median_s",
    "latency_p99_ci_high_s",
    *MEMORY_COLS,
    *TELEMETRY_MAX,
    *TELEMETRY_MEDIAN,
    *accuracy.COLUMNS,
    *ACCURACY_WORST,
    "top1_n",
    "flops_per_image",
    "params",
    "tokens_per_sample",
]


def prepare(results: pd.DataFrame) -> pd.DataFrame:
    """Add ``platform``, ``flags``, ``flagged``, ``warnings`` and telemetry columns to a results frame.

    Missing columns are tolerated (a partial or hand-built frame); ``threads`` becomes an integer
    where 0 means "the library's default".
    """
    df = results.copy()
    if df.empty:
        for c in ["platform", "flags", "flagged", "warnings", "notes"]:
            df[c] = pd.Series(dtype=object)
        return df
    name = df["device_name"] if "device_name" in df else pd.Series([""] * len(df), index=df.index)
    df["platform"] = [
        str(n) if isinstance(n, str) and n else str(d) for n, d in zip(name, df["device"], strict=True)
    ]
    df["platform"] = hosts.split_cpu_hosts(df)  # one CPU name on two hosts: two platforms (analysis.hosts)
    df["threads"] = [int(t) if _num(t) is not None else 0 for t in df.get("threads", [None] * len(df))]
    df["include_transfer"] = [bool(_num(t)) for t in df.get("include_transfer", [0] * len(df))]
    df["seq_len"] = [tokens.seq_len_of(s) for s in df.get("seq_len", [None] * len(df))]
    df["input_mode"] = [input_mode_cell(m) for m in df.get("input_mode", [""] * len(df))]
    extras = [ResultDetails.of(e) for e in df["extra"]] if "extra" in df else [ResultDetails()] * len(df)
    real = [real_tokens(e) for e in extras]  # a mixed-length text batch's (the store's frame has it already)
    if "tokens_per_sample" not in df and any(v == v for v in real):  # only then: other frames are unchanged
        df["tokens_per_sample"] = real
    precs = df["precision"] if "precision" in df else [""] * len(df)
    df["flags"] = [
        row_flags(e) + accuracy.flags(p, e) for e, p in zip(extras, precs, strict=True)
    ]  # accuracy-loss
    none = [None] * len(df)  # per-call vs pipelined beyond guards.RATE_TOLERANCE (GPU rows)
    rates = zip(
        df.get("throughput_ips", none), df.get("throughput_pipelined_ips", none), df["device"], strict=True
    )
    df["flags"] = [
        f + ([r] if (r := rate_flag(a, b, device=d)) else [])
        for f, (a, b, d) in zip(df["flags"], rates, strict=True)
    ]
    df["flagged"] = [bool(f) for f in df["flags"]]
    raw = [row_warnings(c, e) for c, e in zip(df.get("ci_met", [None] * len(df)), extras, strict=True)]
    # a warning only where it can move the number beyond its CI; the rest are notes (analysis.signals)
    records = df.to_dict("records")
    split = [signals.row({**r, "extra": e}, w) for r, e, w in zip(records, extras, raw, strict=True)]
    df["warnings"] = [w for w, _ in split]
    df["notes"] = [n for _, n in split]
    corr = [e.correctness for e in extras]
    for k in ACCURACY_WORST:
        df[k] = [np.nan if c is None or _num(c.get(k)) is None else _num(c.get(k)) for c in corr]
    # the agreement's n and the weights it was taken with: what the agreement can mean (analysis.accuracy)
    df["top1_n"] = [np.nan if c is None or _num(c.n_images) is None else _num(c.n_images) for c in corr]
    df["check_weights"] = ["" if c is None else str(c.get("weights") or "") for c in corr]
    tel = [telemetry_of(e) for e in extras]
    for k in TELEMETRY_MEDIAN + TELEMETRY_MAX:
        df[k] = [t.get(k, np.nan) for t in tel]
    acc = [accuracy.columns(e) for e in extras]
    for k in accuracy.COLUMNS:
        df[k] = [a.get(k, np.nan) for a in acc]
    for c in MEMORY_COLS + ["throughput_pipelined_ips", "flops_per_image", "params"]:
        if c not in df:
            df[c] = np.nan
    return tokens.add_per_token(df)  # tokens/s and J/token of text models (analysis.tokens)


class _Numbers:
    """The numeric columns of the OK rows as one float array, read once for every configuration.

    Why: `aggregate` takes a median, maximum or minimum of about 15 columns per configuration; doing it
    with pandas (a column lookup, ``to_numeric`` and ``dropna`` each time) was most of its time. The
    numbers are the same: NaN and non-numbers are left out, as ``pd.to_numeric(errors="coerce")`` did.
    """

    def __init__(self, ok: pd.DataFrame, cols: list[str]) -> None:
        self.col = {c: j for j, c in enumerate(c for c in dict.fromkeys(cols) if c in ok)}
        self.values = np.column_stack(
            [pd.to_numeric(ok[c], errors="coerce").to_numpy(dtype=float) for c in self.col]
            or [np.empty(len(ok))]
        )
        self.index = ok.index

    def rows(self, frame: pd.DataFrame) -> np.ndarray:
        """The positions of ``frame``'s rows (a group of the OK rows), for `of`."""
        return self.index.get_indexer(frame.index)

    def of(self, rows: np.ndarray, how: str, c: str) -> float:
        """``how`` ("median", "max" or "min") of column ``c`` over ``rows``; NaN when it has no number."""
        if c not in self.col:
            return float("nan")
        v = self.values[rows, self.col[c]]
        v = v[~np.isnan(v)]
        return float(getattr(np, how)(v)) if len(v) else float("nan")


def accuracy_label(row: dict[str, Any] | pd.Series) -> str:
    """The accuracy evidence of one configuration against fp32.

    E.g. 'relL2 0.061 (≤ 0.25), cosine 0.9983 (≥ 0.95) vs fp32; top-1 agreement 0/8 [0%, 37%] on
    synthetic inputs, random weights'.

    relL2 and cosine are shown beside their precision's bounds (`deepgap.core.precision`), which decide the
    verdict without a dataset; the agreement with its n and Clopper-Pearson interval (`analysis.accuracy`).
    """
    from deepgap.core.precision import PRECISIONS

    rel, cos, top1 = (_num(row.get(k)) for k in ACCURACY_WORST)
    if rel is None and cos is None and top1 is None:
        return "unavailable: no correctness check stored"
    p = PRECISIONS.get(str(row.get("precision", "")))
    parts = [
        f"relL2 {rel:.3g}" + (f" (≤ {p.rel_l2_bound:g})" if p else "") if rel is not None else "",
        f"cosine {cos:.4f}" + (f" (≥ {p.cosine_floor:g})" if p else "") if cos is not None else "",
    ]
    text = ", ".join(x for x in parts if x) + " vs fp32" if rel is not None or cos is not None else ""
    ag = accuracy.agreement(top1, row.get("top1_n"), row.get("check_weights"))
    if ag is not None:
        text = f"{text}; {ag.label()}" if text else ag.label()
    return text


def _throughput_ci(used: pd.DataFrame) -> tuple[float, float, str]:
    tp = pd.to_numeric(used["throughput_ips"], errors="coerce").dropna().to_numpy()
    lo = pd.to_numeric(used["throughput_ci_low_ips"], errors="coerce").dropna().to_numpy()
    hi = pd.to_numeric(used["throughput_ci_high_ips"], errors="coerce").dropna().to_numpy()
    if len(tp) >= 3:
        a, b = bootstrap_ci(tp, np.median)
        return a, b, f"bootstrap over {len(tp)} measurements"
    if len(lo) and len(hi):
        return (
            float(lo.min()),
            float(hi.max()),
            ("within-run bootstrap" if len(tp) == 1 else "envelope of 2 measurements' CIs"),
        )
    return float("nan"), float("nan"), "unavailable: no CI stored"


def aggregate(df: pd.DataFrame, samples: sweeps.SamplesFn | None = None) -> pd.DataFrame:
    """One row per configuration (see the module docstring) from a `prepare`-d frame of OK rows.

    ``samples`` (result id → raw latencies, e.g. `Store.samples`): with it, a configuration measured
    in two or more processes gets its CI from the two-level bootstrap (`analysis.sweeps`).

    Returns:
        A frame with `GROUP_COLS`, the aggregated numbers, ``n_measurements``, ``n_runs``,
        ``n_excluded``, ``flags``, ``flagged``, ``warnings``, ``result_ids``, ``run_ids`` and
        ``ci_method``. Empty (with those columns) when no row is OK.
    """
    ok = df[df["status"] == "ok"] if "status" in df and not df.empty else df.iloc[0:0]
    if not ok.index.is_unique:  # `_Numbers` finds a group's rows by their index
        ok = ok.reset_index(drop=True)
    samples = tails.memo(samples) if samples is not None else None  # the CI and the percentiles read them
    num = _Numbers(ok, NUMBER_COLS)
    rows = []
    for key, grp in ok.groupby(GROUP_COLS, sort=True, dropna=False) if len(ok) else []:
        clean = grp[~grp["flagged"]]
        used = clean if len(clean) else grp
        at = num.rows(used)
        row: dict[str, Any] = dict(zip(GROUP_COLS, key, strict=True))
        disagree = _throughput_and_latency(row, used, at, num, samples)
        _tail_energy_accuracy(row, used, at, num, samples)
        signals.judge_row(row, grp, used, disagree)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=EMPTY_COLUMNS)
    return cards.widen(pd.DataFrame(rows), cards.platform_spread(ok))  # one-card intervals: the card spread


EMPTY_COLUMNS = [*GROUP_COLS, "throughput_ips", "flags", "flagged", "warnings", "notes", "result_ids"]
EMPTY_COLUMNS += ["run_ids", "n_measurements", "latency_median_s", "latency_p99_s"]


def _throughput_and_latency(row: dict, used: pd.DataFrame, at: Any, num: _Numbers, samples: Any) -> bool:
    """Throughput and its CI (cards, processes, samples: issue 34), the median latency's; sweeps disagree?"""
    row["throughput_ips"] = num.of(at, "median", "throughput_ips")
    hier = (
        cards.throughput_ci(used, samples) or sweeps.throughput_ci(used, samples)
        if samples is not None and len(used) >= 2
        else None
    )
    row["n_cards"] = len(cards.per_card(used))
    row["card_result_ids"] = cards.result_ids_by_card(used)  # for compare's three-level bootstrap
    ci = hier or _throughput_ci(used)
    row["throughput_ci_low_ips"], row["throughput_ci_high_ips"], row["ci_method"] = ci
    row["between_sweep_cv"], row["sweep_throughputs"], disagree = sweeps.spread(used)
    row["throughput_pipelined_ips"] = num.of(at, "median", "throughput_pipelined_ips")
    row["latency_median_s"] = num.of(at, "median", "latency_median_s")
    bs = float(row["batch_size"])
    # Latency CI follows the throughput CI through latency = batch / throughput (monotone).
    lo, hi = row["throughput_ci_low_ips"], row["throughput_ci_high_ips"]
    row["latency_median_ci_low_s"] = bs / hi if hi and hi == hi else float("nan")
    row["latency_median_ci_high_s"] = bs / lo if lo and lo == lo else float("nan")
    return disagree


def _tail_energy_accuracy(row: dict, used: pd.DataFrame, at: Any, num: _Numbers, samples: Any) -> None:
    """The latency tail (a p99 only where n supports one), memory, telemetry, energy, accuracy, costs."""
    for c in ["latency_p99_ci_high_s", *MEMORY_COLS, *TELEMETRY_MAX]:
        row[c] = num.of(at, "max", c)
    tail = tails.set_percentiles(row, used, samples)
    row["latency_tail_s"], row["latency_tail_kind"] = tail.seconds, tail.kind
    row["latency_tail_n"] = tail.n
    row["latency_tail_label"] = tail.label()
    row["latency_tail_name"] = tail.name()
    if tail.kind != "p99":  # its bootstrap upper end is the sample maximum: no interval to show
        row["latency_p99_ci_high_s"] = float("nan")
    for c in [*TELEMETRY_MEDIAN, *(a for a in accuracy.COLUMNS if a in used)]:
        row[c] = num.of(at, "median", c)
    if row["joules_per_image"] > 0:  # one window: images/s/W × J/image = 1 (see `telemetry_of`)
        row["ips_per_watt"] = 1.0 / row["joules_per_image"]
    for c, how in ACCURACY_WORST.items():
        row[c] = num.of(at, how, c)
    # the same seeded check inputs in every sweep: n is one measurement's, not their sum
    row["top1_n"] = num.of(at, "min", "top1_n")
    row["check_weights"] = ",".join(sorted({str(w) for w in used.get("check_weights", []) if w}))
    if "tokens_per_sample" in used:  # a mixed-length text batch: the same seeded batch in every sweep
        row["tokens_per_sample"] = num.of(at, "median", "tokens_per_sample")
    row.update(tokens.per_token(row))  # from the aggregated samples/s and J/sample
    row["flops_per_image"] = num.of(at, "median", "flops_per_image")
    row["params"] = num.of(at, "median", "params")


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Measurements that produced no number (oom, skipped, error, timeout, crash) with their reasons."""
    if df.empty or "status" not in df:
        return pd.DataFrame(columns=["platform", *CONFIG_COLS, "status", "reason", "run_id"])
    bad = df[df["status"] != "ok"]
    cols = [c for c in ["platform", *CONFIG_COLS, "sweep", "status", "reason", "run_id"] if c in bad]
    return bad[cols].reset_index(drop=True)


def config_label(row: dict[str, Any] | pd.Series, with_platform: bool = True, with_batch: bool = True) -> str:
    """The exact configuration behind a number, as one line of text."""
    parts = [str(row["model"]), str(row["engine"]), str(row["precision"])]
    if row.get("memory_format", "nchw") != "nchw":
        parts.append(str(row["memory_format"]))
    if with_batch:
        parts.append(f"bs{int(row['batch_size'])}")
    if int(row.get("threads", 0) or 0):
        n = int(row["threads"])
        parts.append(f"{n} thread{'s' if n != 1 else ''}")
    seq = tokens.seq_len_of(row.get("seq_len"))
    parts.append(f"seq {seq}" if seq else f"{int(row['resolution'])}px")
    if row.get("include_transfer"):
        parts.append("incl. H2D copy")
    mode = input_mode_cell(row.get("input_mode"))
    if mode:
        parts.append(f"{input_kind(mode)} input ({input_mode_label(mode)})")
    text = " ".join(parts)
    if with_platform:
        text += f" on {row['platform']} ({row['device']})"
    return text


def input_mode_cell(value: Any) -> str:
    """A stored or aggregated ``input_mode`` as the frame holds it: "" for the default input."""
    name = input_name(value)
    return "" if name == "default" else name


def is_default_input(frame: pd.DataFrame) -> pd.Series:
    """Which rows of ``frame`` have the default input (all, where it has no ``input_mode`` column).

    The answer is chosen from these only: a resident-input row is measured without its preprocessing
    (MLPerf's condition), a number of another kind, shown beside the answer and never as it.
    """
    if "input_mode" not in frame:
        return pd.Series(True, index=frame.index)
    return pd.Series([not input_mode_cell(m) for m in frame["input_mode"]], index=frame.index, dtype=bool)


def memory_metric(row: dict[str, Any] | pd.Series) -> tuple[str | None, float | None]:
    """The memory figure a constraint checks: device-wide, else process reserved/allocated, else host RSS."""
    for c in [
        "device_mem_used_bytes",
        "peak_mem_reserved_bytes",
        "peak_mem_allocated_bytes",
        "host_rss_bytes",
    ]:
        v = _num(row.get(c))
        if v is not None and v > 0:
            return c, v
    return None, None
