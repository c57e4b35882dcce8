"""The report's first screen: the answer per model and platform, then how sure we are of it.

Why its own module: the answer is what a reader opens the report for, so it is built from the same
`deepgap.analysis.recommend` the ``recommend`` command uses (one objective per column: throughput,
latency, joules per image) and shown with the evidence a reader needs to trust it: the CI, the
accuracy against the FP32 reference (from each result's ``extra["correctness"]``), the flags, and
whether the runner-up is within the CI. Columns other analysis code adds to the aggregate (a spread
between sweep passes, say) are rendered when present and skipped when not. A GPU platform's model whose
run also measured its host CPU (docs/cpu-baseline.md) gets one more line, "× host CPU": the GPU's best
against the CPU's best in throughput, latency at batch 1 and joules per image (`analysis.host_cpu`). A
resident-input configuration (int8 images already in GPU memory, MLPerf-like) is never the answer: its best
gets a labelled line of its own beside it, with MLPerf's published number and conditions where one exists
for the platform (`analysis.mlperf`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.analysis import mlperf, tails
from deepgap.analysis.coverage import grid_gaps
from deepgap.analysis.decode_section import answer_rows as decode_answer_rows
from deepgap.analysis.frame import config_label
from deepgap.analysis.host_cpu import HostCpuLine, Ratio, host_cpu_lines
from deepgap.analysis.recommend import OBJECTIVES, recommend
from deepgap.core.records import input_mode_label
from deepgap.core.stats import finite_or_none as _f
from deepgap.render.formatting import fmt_ci, fmt_ips, fmt_list, fmt_ms, fmt_num, fmt_x
from deepgap.render.units import is_text_row
from deepgap.report.answer_accuracy import (  # noqa: F401 (ANSWER_ACCURACY_HEADER, accuracy_text: API)
    ANSWER_ACCURACY_HEADER,
    accuracy,
    accuracy_by_result,
    accuracy_text,
)

GOALS = {"throughput": "throughput", "latency": "latency", "joules": "per joule"}
HOST_CPU_GOAL = "× host CPU"


def _short(row: dict[str, Any]) -> str:
    """The configuration without model, platform and resolution (those head the row)."""
    parts = [str(row["engine"]), str(row["precision"])]
    if row.get("memory_format", "nchw") != "nchw":
        parts.append(str(row["memory_format"]))
    parts.append(f"bs{int(row['batch_size'])}")
    if int(row.get("threads") or 0):
        parts.append(f"{int(row['threads'])} thr")
    if row.get("include_transfer"):
        parts.append("+H2D")
    if row.get("input_mode"):  # a resident or mixed-length input (core.records.INPUT_MODES)
        parts.append(str(row["input_mode"]))
    return " ".join(parts)


def _numbers(row: dict[str, Any], objective: str) -> tuple[str, str, str]:
    """(headline number, its 95% CI, the other numbers) of one configuration for one objective."""
    ips, med = row.get("throughput_ips"), row.get("latency_median_s")
    tail = tails.from_row(row)  # a P99 only where n supports one, else "tail (max of n calls)"
    tail_ms = f"{tail.short()} {fmt_ms(tail.seconds)} ms"
    seq = int(_f(row.get("seq_len")) or 0)  # a text model: samples are sequences of this length
    rate = f"{fmt_ips(ips)} seq/s at seq {seq}" if seq else f"{fmt_ips(ips)} img/s"
    if objective == "latency":
        ci = fmt_ci(row.get("latency_median_ci_low_s"), row.get("latency_median_ci_high_s"), fmt_ms)
        return f"{fmt_ms(med)} ms", ci + (" ms" if ci != "–" else ""), f"{tail_ms} · {rate}"
    if seq:  # tokens are the unit people read (analysis.tokens)
        return _text_numbers(row, objective, rate)
    if objective == "throughput":
        ci = fmt_ci(row.get("throughput_ci_low_ips"), row.get("throughput_ci_high_ips"))
        # The headline is batch ÷ median synchronized latency (the paper's); back to back the same batches
        # can run slower: at a power cap each synchronized call starts after an idle gap at full clock
        # (ResNet-50 fp8 at 1024 on an H200: 58,458 against 57,063 img/s, results/h200/session27)
        piped = _f(row.get("throughput_pipelined_ips"))
        back = [f"back to back {fmt_ips(piped)} img/s"] if piped else []
        return rate, ci, " · ".join([f"median {fmt_ms(med)} ms{_per_batch(row)}", tail_ms, *back])
    j = _f(row.get("joules_per_image"))
    return (
        f"{fmt_num(j * 1e3 if j is not None else None)} mJ/img",
        "–",
        # img/s/W is the energy windows' (back-to-back) rate over their watts, not the headline rate's
        f"{fmt_num(row.get('ips_per_watt'))} img/s/W back to back · {fmt_num(row.get('mean_power_w'))} W · {rate}",
    )


def _per_batch(row: dict[str, Any]) -> str:
    """``/batch`` where a median is a batch's, not one item's (nothing at batch 1; the batch is in its label)."""
    return "/batch" if int(_f(row.get("batch_size")) or 1) > 1 else ""


def _text_numbers(row: dict[str, Any], objective: str, samples: str) -> tuple[str, str, str]:
    """`_numbers` of a text model's throughput and energy: tokens/s and mJ/token first, ``samples``/s beside."""
    if objective == "throughput":
        ci = fmt_ci(row.get("tokens_ci_low_per_s"), row.get("tokens_ci_high_per_s"))
        med = fmt_ms(row.get("latency_median_s"))
        return (
            f"{fmt_ips(row.get('tokens_per_s'))} tokens/s",
            ci,
            f"{samples} · median {med} ms{_per_batch(row)}",
        )
    j, jt = _f(row.get("joules_per_image")), _f(row.get("joules_per_token"))
    return (
        f"{fmt_num(jt * 1e3 if jt is not None else None)} mJ/token",
        "–",
        f"{fmt_num(j * 1e3 if j is not None else None)} mJ/sequence · {fmt_num(row.get('mean_power_w'))} W"
        f" · {samples}",
    )


def _lead(best: dict[str, Any], runner: dict[str, Any] | None, objective: str) -> str:
    """How far the choice is ahead of the runner-up, and whether that is inside the CI."""
    if runner is None:
        return "only candidate"
    if objective == "joules":
        a, b = _f(best.get("joules_per_image")), _f(runner.get("joules_per_image"))
        return f"{100 * (b / a - 1):+.1f}% vs {_short(runner)}" if a and b else "–"
    col = "throughput_ips" if objective == "throughput" else "latency_median_s"
    a, b = _f(best.get(col)), _f(runner.get(col))
    if not a or not b:
        return "–"
    ahead = (a / b - 1) if objective == "throughput" else (b / a - 1)
    if objective == "throughput":
        tie = (_f(best.get("throughput_ci_low_ips")) or a) <= (_f(runner.get("throughput_ci_high_ips")) or b)
    else:
        tie = (_f(best.get("latency_median_ci_high_s")) or a) >= (
            _f(runner.get("latency_median_ci_low_s")) or b
        )
    return f"{100 * ahead:+.1f}% vs {_short(runner)}" + (" (CIs overlap: a tie)" if tie else "")


def _by_label(sub: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """``sub``'s rows by their configuration label (the first row of a label), read once per model."""
    out: dict[str, dict[str, Any]] = {}
    for r in sub.to_dict("records"):
        out.setdefault(config_label(r), r)
    return out


def _row_of(rows: dict[str, dict[str, Any]], choice: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row a recommendation chose (``choice``: `recommend`'s choice or runner-up), from `_by_label`."""
    return rows.get(choice["configuration"]) if choice is not None else None


def _ratio_text(what: str, r: Ratio) -> str:
    """``bs1 latency 6.1× [5.2×, 7.0×] (eager fp16 bs1 ÷ eager fp32 bs1 16 thr)``, or why not."""
    if not r.ok:
        return f"{what}: {r.why}"
    ci = fmt_ci(r.ci_low, r.ci_high, fmt_x)
    sides = f"{_short(r.gpu)} ÷ {_short(r.cpu)}" if r.gpu and r.cpu else ""
    sides = f"{r.pairing}: {sides}" if r.pairing and sides else sides
    return f"{what} {fmt_x(r.value)}" + (f" {ci}" if ci != "–" else "") + (f" ({sides})" if sides else "")


def _compact(what: str, r: Ratio) -> str:
    """``bs1 latency 8.00×``, or ``J/img: no CPU energy (RAPL unreadable)``: short, for the answer's cell."""
    if r.ok:
        return f"{what} {fmt_x(r.value)}"
    if r.why.startswith("CPU energy"):
        rapl = "RAPL" in r.why or "powercap" in r.why
        return f"{what}: no CPU energy" + (" (RAPL unreadable)" if rapl else "")
    return f"{what}: –"


def host_cpu_row(line: HostCpuLine) -> dict[str, Any]:
    """The answer's "× host CPU" line of one GPU platform and model (GPU over CPU: higher = the GPU).

    Compact, so that the answer still fits the first screen; ``host_cpu_detail`` (in answer.csv) carries
    every ratio with its interval, both configurations and the full reason for a missing one.
    """
    tp = line.throughput
    per = "J/seq" if tp.gpu and is_text_row(tp.gpu) else "J/img"  # a text model's energy is per sequence
    return {
        "platform": line.platform,
        "model": line.model,
        "resolution": line.resolution,
        "goal": HOST_CPU_GOAL,
        "configuration": _short(tp.gpu) if tp.gpu else "",
        "value": fmt_x(tp.value) if tp.ok else "–",  # a ratio: no unit
        "ci": fmt_ci(tp.ci_low, tp.ci_high, fmt_x) if tp.ok else "–",
        "also": " · ".join([_compact("bs1 latency", line.latency_bs1), _compact(per, line.joules)]),
        "accuracy": "",
        "flags": "",
        "n": f"{tp.pairing}: vs {_short(tp.cpu)} on {line.cpu_platform}"
        if tp.cpu
        else f"vs {line.cpu_platform}",
        "answered": tp.ok,
        "host_cpu_detail": " · ".join(
            [
                _ratio_text("throughput", tp),
                _ratio_text("bs1 latency", line.latency_bs1),
                _ratio_text("J/sequence" if per == "J/seq" else "J/image", line.joules),
            ]
        ),
    }


# a spread column as the how-sure cell says it (it printed the raw name "between_sweep_cv")
SPREAD_WORDS = {"between_sweep_cv": "between-sweep CV"}


def spread_columns(agg: pd.DataFrame) -> list[str]:
    """Columns of the aggregate that measure spread between sweep passes or runs (when present)."""
    return [c for c in agg.columns if "spread" in c or c.startswith("cv_") or c.endswith("_cv")]


def answers(
    agg: pd.DataFrame, df: pd.DataFrame, decode: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The answer table (per platform, model, objective) and the how-sure table (per platform, model).

    Recommendations come from `recommend` on each platform's configurations; ``decode`` (the decode
    section's `deepgap.analysis.decode.decode_table`) adds the decoders' rows after them
    (`deepgap.analysis.decode_section.answer_rows`).
    """
    dec = decode_answer_rows(decode) if decode is not None and len(decode) else pd.DataFrame()
    if agg.empty:
        return dec, pd.DataFrame()
    acc = accuracy_by_result(df)
    spread = spread_columns(agg)
    rows, sure = [], []
    fail = df[df["status"] != "ok"] if "status" in df else df.iloc[0:0]
    # the fastest platform first (GPUs before the CPU baseline), then by name
    order = agg.groupby("platform")["throughput_ips"].max().sort_values(ascending=False).index
    host = {(ln.platform, ln.model, ln.resolution): ln for ln in host_cpu_lines(agg, df)}
    for platform in order:
        sub = agg[agg["platform"] == platform]
        recs = {obj: {(r.model, r.resolution): r for r in recommend(sub, obj)} for obj in OBJECTIVES}
        for (model, res), _ in sub.groupby(["model", "resolution"], sort=True):
            msub = sub[(sub["model"] == model) & (sub["resolution"] == res)]
            labelled = _by_label(msub)
            leads, missing = [], []
            for obj in OBJECTIVES:
                rec = recs[obj].get((model, res))
                best = _row_of(labelled, rec.choice if rec else None)
                base = {"platform": platform, "model": model, "resolution": int(res), "goal": GOALS[obj]}
                base["axis"] = _axis(msub, res)  # "seq 128" for a text model, never "128px"
                if best is None:
                    why = rec.reason if rec else "no candidate"
                    rows.append(
                        {
                            **base,
                            "configuration": "",
                            "value": "–",
                            "ci": "–",
                            "also": why,
                            "accuracy": "",
                            "flags": "",
                            "n": "",
                            "answered": False,
                        }
                    )
                    missing.append(f"{GOALS[obj]}: {why}")
                    continue
                value, ci, also = _numbers(best, obj)
                also = _with_text_anchor(also, best, obj, platform, model, res)
                runner = _row_of(labelled, rec.runner_up)
                leads.append(f"{GOALS[obj]}: {_lead(best, runner, obj)}")
                rows.append(
                    {
                        **base,
                        "configuration": _short(best),
                        "value": value,
                        "ci": ci,
                        "also": also,
                        "accuracy": accuracy_text(accuracy(best, acc), is_text_row(best)),
                        "flags": fmt_list(best.get("warnings")),
                        "n": f"{int(best.get('n_measurements') or 0)} meas.,"
                        f" {int(best.get('n_runs') or 0)} run(s)",
                        "answered": True,
                        **{c: best.get(c) for c in spread},
                    }
                )
            line = host.get((platform, model, int(res)))
            if line is not None:
                rows.append({**host_cpu_row(line), "axis": _axis(msub, res)})
            rows += _resident_rows(platform, model, res, msub, acc)  # beside the answer, never as it
            sure.append(_how_sure(platform, model, res, msub, fail, spread, leads, missing))
    forward = pd.DataFrame(rows)
    return (pd.concat([forward, dec], ignore_index=True) if len(dec) else forward), pd.DataFrame(sure)


def _with_text_anchor(also: str, best: dict[str, Any], obj: str, platform: Any, model: Any, res: Any) -> str:
    """A text model's throughput answer with MLPerf's number beside it where one stands by it (BERT-99)."""
    if obj != "throughput" or not is_text_row(best):
        return also
    lines = mlperf.text_anchor_lines(str(platform), str(model), int(res), _f(best.get("throughput_ips")))
    return " · ".join([also, *lines])


def _resident_rows(
    platform: Any, model: Any, res: Any, msub: pd.DataFrame, acc: dict
) -> list[dict[str, Any]]:
    """The best resident-input row per mode (`analysis.mlperf`): labelled, with MLPerf's anchor, never the answer."""
    rows = []
    for r in mlperf.resident_best(msub):  # beside the answer, labelled, never as it
        value, ci, also = _numbers(r, "throughput")
        anchors = mlperf.mode_anchor_lines(str(platform), str(model), r)
        rows.append(
            {
                **{
                    "platform": platform,
                    "model": model,
                    "resolution": int(res),
                    "axis": _axis(msub, res),
                },
                "goal": input_mode_label(r["input_mode"]),
                "configuration": _short(r),
                "value": value,
                "ci": ci,
                "also": " · ".join([f"not the answer: {mlperf.mode_note(r['input_mode'])}", also, *anchors]),
                "accuracy": accuracy_text(accuracy(r, acc), is_text_row(r)),
                "flags": fmt_list(r.get("warnings")),
                "n": f"{int(r.get('n_measurements') or 0)} meas., {int(r.get('n_runs') or 0)} run(s)",
                "answered": True,
            }
        )
    return rows


def _how_sure(
    platform: Any,
    model: Any,
    res: Any,
    msub: pd.DataFrame,
    fail: pd.DataFrame,
    spread: list[str],
    leads: list[str],
    missing: list[str],
) -> dict[str, Any]:
    """The how-sure row of one platform and model: leads, CI spread, flags, warnings, what was not measured."""
    flagged = msub[msub["flagged"]]
    reasons: dict[str, int] = {}
    for fl in flagged["flags"]:
        for f in fl:
            key = f.split("(")[0]
            reasons[key] = reasons.get(key, 0) + 1
    warned: dict[str, int] = {}
    for ws in msub["warnings"]:
        for w in ws:
            warned[w] = warned.get(w, 0) + 1
    mfail = fail[(fail["model"] == model) & (fail["platform"] == platform)] if len(fail) else fail
    gaps = [
        f"{n}× {status}: {reason[:90]}"
        for (status, reason), n in (mfail.groupby(["status", "reason"]).size().items() if len(mfail) else [])
    ]
    cis = [
        (_f(r["throughput_ci_high_ips"]) - _f(r["throughput_ci_low_ips"])) / 2 / _f(r["throughput_ips"])
        for r in msub.to_dict("records")
        if _f(r.get("throughput_ci_high_ips"))
        and _f(r.get("throughput_ci_low_ips"))
        and _f(r.get("throughput_ips"))
    ]
    spread_txt = (
        f"CI ±{100 * float(pd.Series(cis).median()):.1f}% median, ±{100 * max(cis):.1f}% worst"
        f" over {len(cis)} configuration{'s' if len(cis) != 1 else ''}"
        if cis
        else "no CI stored"
    )
    for c in spread:
        v = pd.to_numeric(msub[c], errors="coerce").dropna()
        if len(v):
            spread_txt += (
                f"; {SPREAD_WORDS.get(c, c.replace('_', ' '))} median {v.median():.3g}, max {v.max():.3g}"
            )
    return {
        "platform": platform,
        "model": model,
        "resolution": int(res),
        "lead": leads,
        "spread": spread_txt,
        "flags": [f"{n} configuration(s) {k}" for k, n in sorted(reasons.items())]
        + [f"{int(msub['n_excluded'].sum())} flagged measurement(s) left out"]
        * bool(msub["n_excluded"].sum() if "n_excluded" in msub else 0),
        "warnings": [f"{n}× {w}" for w, n in sorted(warned.items())] + _notes(msub),
        "not_measured": missing + gaps + grid_gaps(msub, mfail),
    }


def _axis(msub: pd.DataFrame, res: Any) -> str:
    """What heads a model's answer: its sequence length for a text model ("seq 128"), else "224px"."""
    seqs = [
        int(v)
        for v in pd.to_numeric(msub.get("seq_len", pd.Series(dtype=float)), errors="coerce").dropna()
        if v > 0
    ]
    return "seq " + ", ".join(map(str, sorted(set(seqs)))) if seqs else f"{int(res)}px"


def _notes(msub: pd.DataFrame) -> list[str]:
    """The notes (not warnings: they cannot move a number beyond its CI, `analysis.signals`), counted."""
    noted: dict[str, int] = {}
    for ns in msub.get("notes", []):
        for n in ns:
            noted[n] = noted.get(n, 0) + 1
    return [f"note, not a warning: {n}× {w}" for w, n in sorted(noted.items())]
