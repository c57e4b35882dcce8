"""The answer for decoders: fastest, lowest TPOT, most tokens per joule; and the GPU against its host CPU.

Per device and model, from `deepgap.analysis.decode.decode_table`'s rows.

Why apart from `deepgap.analysis.recommend`: a decode row's goals are output tokens/s, the time per output
token and tokens per joule, not images/s, batch latency and J/image, and its rows are not in the forward
aggregate. Candidates are the ``ok`` rows whose logits are within their precision's bounds against fp32
(a flagged row is never the answer: it is counted as excluded). A row with an fp8 KV cache is a candidate
beside the decoder's own cache (a serving choice, checked against fp32 as every row), named so by `short`.
Rows of different input/output lengths are different workloads, so each (device, model, lengths) gets its
own answer; the host CPU's rows (fp32 decode of the small decoders, `deepgap.drive.plan.host_cpu_decode`)
are a device of their own, and `cpu_lines` sets each GPU's best against them with both sides named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap.core.records import kv_cache_suffix

GOALS = {
    "throughput": ("output_tokens_per_s", False, "highest output tokens/s"),
    "tpot": ("tpot_median_ms", True, "lowest median TPOT"),
    "joules": ("joules_per_token", True, "most tokens per joule"),
}


def num(v: Any) -> float:
    """A finite float, else NaN (a blank or non-numeric cell)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def short(r: dict[str, Any]) -> str:
    """``eager bf16 bs8 128/128``: the configuration without device and model.

    A row with a KV cache of its own format says so (``eager bf16 bs8 128/128 fp8 KV cache``): it is
    a candidate beside the decoder's own cache, and must never read as one.
    """
    lens = f"{int(r['input_len'])}/{int(r['output_len'])}"
    return (
        f"{r['engine']} {r['precision']} bs{int(r['batch_size'])} {lens}{kv_cache_suffix(r.get('kv_cache'))}"
    )


def is_cpu(r: dict[str, Any]) -> bool:
    """Whether a row was measured on a CPU (the host part, or a CPU sweep)."""
    return str(r.get("device", "")) == "cpu"


def platform(r: dict[str, Any]) -> str:
    """The device a row ran on, by name (``NVIDIA H200``, the CPU's model name), else its device string."""
    return str(r.get("device_name") or r.get("device") or "?")


def value_text(r: dict[str, Any], goal: str) -> str:
    """The headline number of one row for one goal, unit named."""
    if goal == "throughput":
        return f"{num(r.get('output_tokens_per_s')):,.1f} output tokens/s"
    if goal == "tpot":
        return f"TPOT {num(r.get('tpot_median_ms')):.3f} ms"
    j = num(r.get("joules_per_token"))
    return f"{1 / j:,.3g} tokens/J ({j:.3g} J/token)" if j > 0 else "no energy"


def also_text(r: dict[str, Any]) -> str:
    """The row's other figures: decode tokens/s with its CI, TPOT and its tail, TTFT, its roofline share."""
    lo, hi = num(r.get("decode_tokens_per_s_ci_low")), num(r.get("decode_tokens_per_s_ci_high"))
    ci = f" [{lo:,.1f}, {hi:,.1f}]" if lo == lo and hi == hi else ""
    parts = [
        f"decode {num(r.get('decode_tokens_per_s')):,.1f} tokens/s{ci}",
        f"TPOT {num(r.get('tpot_median_ms')):.3f} ms median, {num(r.get('tpot_tail_ms')):.3f} ms "
        f"{r.get('tpot_tail_label') or 'tail'}",
        f"TTFT {num(r.get('ttft_median_ms')):.2f} ms median of n={r.get('ttft_n')}",
    ]
    parts += [bound_text(r)] if bound_text(r) else []
    return " · ".join(parts)


def bound_text(r: dict[str, Any]) -> str:
    """The row's decode rate against its binding bound, named; "" without a bound.

    The memory bound, or the compute bound where that is the lower (``bound_limiter``). Large batches: at
    batch 1024 of the 8B shape in fp8 on one H200 the memory bound is 240,959 tokens/s and the dense fp8
    peak's 130,966 (session 53), so "0.17× the memory bound" undersold how near the row ran to its roof.
    """
    share, memory = num(r.get("fraction_of_bound")), num(r.get("bound_tokens_per_s"))
    compute, rate = num(r.get("compute_bound_tokens_per_s")), num(r.get("decode_tokens_per_s"))
    if r.get("bound_limiter") == "compute" and compute > 0 and rate == rate:
        return f"{rate / compute:.2f}× the compute bound of {compute:,.0f} tokens/s (the memory bound: {memory:,.0f})"
    return f"{share:.2f}× the memory bound of {memory:,.0f} tokens/s" if share == share else ""


@dataclass
class DecodeAnswer:
    """One device, model and length pair: the chosen row per goal (None: why in ``missing``)."""

    platform: str
    model: str
    input_len: int
    output_len: int
    choice: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # goal → row
    runner_up: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # goal → why no answer
    excluded: dict[str, int] = field(default_factory=dict)  # reason → rows
    considered: int = 0


def candidates(tab: pd.DataFrame) -> tuple[pd.DataFrame, dict[tuple, dict[str, int]]]:
    """(the rows an answer may choose, per group the excluded rows counted by reason)."""
    excluded: dict[tuple, dict[str, int]] = {}
    keep = []
    for r in tab.to_dict("records"):
        key = (platform(r), r["model"], int(r["input_len"]), int(r["output_len"]))
        why = ""
        if r.get("status") != "ok":
            why = str(r.get("status"))
        elif r.get("logits_flagged") is True:
            why = "flagged: logits beyond the precision's bounds vs fp32"
        elif not num(r.get("output_tokens_per_s")) > 0:
            why = "no output tokens/s"
        if why:
            excluded.setdefault(key, {})
            excluded[key][why] = excluded[key].get(why, 0) + 1
        else:
            keep.append({**r, "platform": platform(r)})
    return pd.DataFrame(keep), excluded


def decode_answers(tab: pd.DataFrame) -> list[DecodeAnswer]:
    """One `DecodeAnswer` per (device, model, input/output lengths) of a decode table, fastest device first."""
    if tab is None or tab.empty:
        return []
    ok, excluded = candidates(tab)
    keys = sorted(excluded)
    if not ok.empty:
        keys = sorted(
            set(keys) | set(zip(ok["platform"], ok["model"], ok["input_len"], ok["output_len"], strict=True))
        )
    out = []
    for key in keys:
        sub = ok[(ok["platform"] == key[0]) & (ok["model"] == key[1])] if not ok.empty else pd.DataFrame()
        if not sub.empty:
            sub = sub[(sub["input_len"] == key[2]) & (sub["output_len"] == key[3])]
        ans = DecodeAnswer(*key[:2], int(key[2]), int(key[3]), excluded=excluded.get(key, {}))
        ans.considered = len(sub)
        for goal, (col, lowest, _) in GOALS.items():
            rows = sub[pd.to_numeric(sub[col], errors="coerce") > 0] if not sub.empty else sub
            if rows.empty:
                ans.choice[goal] = None
                ans.missing[goal] = (
                    "no energy telemetry" if goal == "joules" and not sub.empty else "no candidate"
                )
                continue
            ranked = rows.sort_values(col, ascending=lowest).to_dict("records")
            ans.choice[goal] = ranked[0]
            ans.runner_up[goal] = ranked[1] if len(ranked) > 1 else None
        out.append(ans)
    best: dict[str, float] = {}  # each device's highest output tokens/s: the fastest device first
    for a in out:
        v = num((a.choice.get("throughput") or {}).get("output_tokens_per_s"))
        best[a.platform] = max(best.get(a.platform, 0.0), v if v == v else 0.0)
    return sorted(out, key=lambda a: (-best[a.platform], a.platform, a.model, a.input_len, a.output_len))


@dataclass(frozen=True)
class CpuLine:
    """One GPU device and model against the host CPU's decode of the same model, each ratio with both sides."""

    platform: str
    model: str
    cpu_platform: str
    texts: tuple[str, ...]  # "throughput: …", "batch-1 TPOT: …", "tokens/J: …" or why not


def _best(rows: pd.DataFrame, col: str, lowest: bool) -> dict[str, Any] | None:
    rows = rows[pd.to_numeric(rows[col], errors="coerce") > 0] if not rows.empty else rows
    return None if rows.empty else rows.sort_values(col, ascending=lowest).iloc[0].to_dict()


def _ratio(what: str, g: dict | None, c: dict | None, col: str, unit: str, lower: bool) -> str:
    if g is None or c is None:
        return f"{what}: unavailable ({'the GPU' if g is None else 'the CPU'} has no such row)"
    gv, cv = num(g[col]), num(c[col])
    x = cv / gv if lower else gv / cv
    word = "lower" if lower else "higher"
    return (
        f"{what}: GPU {gv:,.4g} {unit} ({short(g)}) vs CPU {cv:,.4g} {unit} ({short(c)}) = "
        f"{x:,.3g}× {word} on the GPU"
    )


# (what, column, unit, lower is better, batch or None for any): the GPU × CPU comparisons, best against best
COMPARED = (
    ("output tokens/s", "output_tokens_per_s", "tokens/s", False, None),
    ("batch-1 TPOT", "tpot_median_ms", "ms", True, 1),
    ("energy per token", "joules_per_token", "J/token", True, None),
)


def _at(rows: pd.DataFrame, batch: int | None) -> pd.DataFrame:
    return rows if batch is None else rows[rows["batch_size"] == batch]


def cpu_lines(tab: pd.DataFrame) -> list[CpuLine]:
    """Per GPU device and model, its best against the CPU's best: output tokens/s, batch-1 TPOT, J/token.

    A model the CPU did not decode (above the host part's 2B parameters) says so instead of a ratio.
    """
    ok, _ = candidates(tab) if tab is not None and not tab.empty else (pd.DataFrame(), {})
    if ok.empty:
        return []
    cpu_mask = ok["device"].astype(str) == "cpu"
    cpu, gpu = ok[cpu_mask], ok[~cpu_mask]
    if cpu.empty or gpu.empty:
        return []
    out = []
    for (plat, model), g in gpu.groupby(["platform", "model"], sort=True):
        c = cpu[cpu["model"] == model]
        name = ", ".join(sorted(set(cpu["platform"])))
        if c.empty:
            texts = (f"no host-CPU row of {model} (the host part decodes decoders of at most 2B parameters)",)
        else:
            texts = tuple(
                _ratio(what, _best(_at(g, bs), col, lower), _best(_at(c, bs), col, lower), col, unit, lower)
                for what, col, unit, lower, bs in COMPARED
            )
        out.append(CpuLine(str(plat), str(model), name, texts))
    return out
