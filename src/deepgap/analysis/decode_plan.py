"""``deepgap plan --target-tok-s``: the devices that give a decoder's target tokens/s at a TPOT and TTFT SLO.

Per device kind, from the stored decode curves (`deepgap.analysis.decode.decode_table`'s rows).

Why from the stored rows and not the serving simulator: a decode row is one batch generated start to end
(static batching), so its output tokens/s (batch × output tokens ÷ end-to-end time, the prefill included)
is what one device sustains at that batch, and its TPOT tail and TTFT are what each sequence sees. A
configuration meets the SLO when its TPOT tail (a p99 where n ≥ 368, else the maximum of n, named) is
within ``tpot_slo_s`` and its median TTFT (the batch's prefill) within ``ttft_slo_s``; per device kind the
one with the highest output tokens/s is chosen and ⌈target ÷ its tokens/s⌉ devices carry the target.
Continuous batching (admitting a sequence at each step) does better than this at the same SLO; it is what
``deepgap serve`` measures. Power is J/token × decode tokens/s where energy was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from deepgap.analysis.decode_answer import candidates, num, short
from deepgap.core.errors import UsageError

MLPERF_TPOT_S = 0.1  # MLPerf's Llama-3.1-8B server limits (issue 51): TPOT ≤ 100 ms, TTFT ≤ 2 s
MLPERF_TTFT_S = 2.0


@dataclass
class DecodePlanRow:
    """One device kind's answer: the configuration, its tokens/s per device, the devices, or why none."""

    platform: str
    configuration: str = ""
    tokens_per_s_per_device: float | None = None
    devices: int | None = None
    watts_per_device: float | None = None
    tpot_tail_ms: float | None = None
    tpot_tail_label: str = ""
    ttft_median_ms: float | None = None
    why: str = ""
    alternatives: list[str] = field(default_factory=list)


def misses(r: dict[str, Any], tpot_slo_s: float, ttft_slo_s: float) -> list[str]:
    """How a row breaks the SLO, each with both numbers (empty: it meets it)."""
    out = []
    tail, ttft = num(r.get("tpot_tail_ms")), num(r.get("ttft_median_ms"))
    if tail != tail:
        out.append("no TPOT tail stored")
    elif tail > tpot_slo_s * 1e3:
        out.append(f"TPOT {tail:.3g} ms ({r.get('tpot_tail_label')}) > SLO {tpot_slo_s * 1e3:g} ms")
    if ttft != ttft:
        out.append("no TTFT stored")
    elif ttft > ttft_slo_s * 1e3:
        out.append(f"TTFT {ttft:.4g} ms (median) > SLO {ttft_slo_s * 1e3:g} ms")
    return out


def plan_decode(
    tab: pd.DataFrame, model: str, target_tok_s: float, tpot_slo_s: float, ttft_slo_s: float
) -> list[DecodePlanRow]:
    """Per device kind holding decode rows of ``model``, fewest devices first (see the module docstring)."""
    if not target_tok_s > 0 or not math.isfinite(target_tok_s):
        raise UsageError(
            f"--target-tok-s {target_tok_s!r} is not a positive rate", "pass e.g. --target-tok-s 8000"
        )
    ok, _ = candidates(tab) if tab is not None and not tab.empty else (pd.DataFrame(), {})
    mine = ok[ok["model"] == model] if not ok.empty else ok
    if mine.empty:
        known = sorted(set(ok["model"])) if not ok.empty else []
        raise UsageError(
            f"the stores hold no successful decode row of {model!r}",
            f"pass --model from: {', '.join(known)}"
            if known
            else f"measure it first: deepgap run --workload decode --models {model}",
        )
    out = []
    for plat, rows in mine.groupby("platform", sort=True):
        ranked = rows.sort_values("output_tokens_per_s", ascending=False).to_dict("records")
        meets = [r for r in ranked if not misses(r, tpot_slo_s, ttft_slo_s)]
        row = DecodePlanRow(str(plat))
        row.alternatives = [
            f"{short(r)}: {num(r['output_tokens_per_s']):,.1f} tokens/s; "
            + ("; ".join(misses(r, tpot_slo_s, ttft_slo_s)) or "meets the SLO")
            for r in ranked
        ]
        if not meets:
            row.why = "none meets the SLO: " + "; ".join(
                f"{short(r)}: {', '.join(misses(r, tpot_slo_s, ttft_slo_s))}" for r in ranked[:1]
            )
            out.append(row)
            continue
        best = meets[0]
        rate = num(best["output_tokens_per_s"])
        j, dec = num(best.get("joules_per_token")), num(best.get("decode_tokens_per_s"))
        row.configuration = short(best)
        row.tokens_per_s_per_device = rate
        row.devices = math.ceil(target_tok_s / rate)
        row.watts_per_device = j * dec if j == j and dec == dec else None
        row.tpot_tail_ms, row.tpot_tail_label = num(best["tpot_tail_ms"]), str(best.get("tpot_tail_label"))
        row.ttft_median_ms = num(best["ttft_median_ms"])
        row.why = (
            f"⌈{target_tok_s:,.0f} ÷ {rate:,.1f} output tokens/s per device⌉ = {row.devices}; the fastest of "
            f"{len(meets)} configuration(s) within TPOT ≤ {tpot_slo_s * 1e3:g} ms and TTFT ≤ "
            f"{ttft_slo_s * 1e3:g} ms"
        )
        out.append(row)
    return sorted(out, key=lambda r: (r.devices is None, r.devices or 0, r.platform))
