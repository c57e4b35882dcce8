"""``deepgap plan --target-tok-s``: the devices that give a decoder's target tokens/s at a TPOT and TTFT SLO.

Per device kind, from the stored decode curves (`deepgap.analysis.decode.decode_table`'s rows).

Why from the stored rows and not the serving simulator: a decode row is one batch generated start to end
(static batching), so its output tokens/s (batch × output tokens ÷ end-to-end time, the prefill included)
is what one device sustains at that batch, and its TPOT tail and TTFT are what each sequence sees. A
configuration meets the SLO when its TPOT tail (a p99 where n ≥ 368, else the maximum of n, named) is
within ``tpot_slo_s`` and its median TTFT (the batch's prefill) within ``ttft_slo_s``; per device kind the
one with the highest output tokens/s is chosen (``--objective watts``: the fewest watts in all, where power
was measured) and ⌈target ÷ its tokens/s⌉ devices carry the target.

A plan is for one workload: rows of other input/output lengths (a 1000/1000 row's tokens/s is not a
128/128 one's), engines, precisions, device kinds or batches above ``--max-batch`` are left out by
`DecodeScope`, and stores holding the model at several lengths need ``--input-len``/``--output-len``
rather than mixing them (as a text encoder needs ``--seq-len``).
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
# a target past this is a typo: a billion output tokens a second is about a hundred thousand H200s' worth
MAX_TARGET_TOK_S = 1e9


@dataclass(frozen=True)
class DecodeScope:
    """The rows a plan may use: empty tuples and None keep all."""

    engines: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()  # resolved names (`analysis.platforms.resolve_platform`)
    max_batch: int | None = None
    input_len: int | None = None
    output_len: int | None = None


def _pairs(rows: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted({(int(i), int(o)) for i, o in zip(rows["input_len"], rows["output_len"], strict=True)})


def _listed(pairs: list[tuple[int, int]]) -> str:
    return ", ".join(f"{i}/{o}" for i, o in pairs)


def scoped(mine: pd.DataFrame, model: str, scope: DecodeScope) -> pd.DataFrame:
    """``mine`` (one model's candidate rows) within ``scope``, at one input/output pair; a `UsageError` else."""
    keep = pd.Series(True, index=mine.index)
    for col, values, flag in (
        ("engine", scope.engines, "--engine"),
        ("precision", scope.precisions, "--precision"),
        ("platform", scope.platforms, "--platforms"),
    ):
        if values:
            hit = mine[col].astype(str).isin(values)
            if not (keep & hit).any():
                have = ", ".join(sorted(set(mine.loc[keep, col].astype(str)))) or "none"
                raise UsageError(
                    f"no decode row of {model} with {flag} {','.join(values)} (the stores hold: {have})",
                    f"pass {flag} from those, or drop it",
                )
            keep &= hit
    if scope.max_batch is not None:
        keep &= mine["batch_size"].astype(int) <= scope.max_batch
        if not keep.any():
            raise UsageError(
                f"no decode row of {model} at a batch ≤ --max-batch {scope.max_batch} "
                f"(the smallest stored is {int(mine['batch_size'].min())})",
                "pass a larger --max-batch, or drop it",
            )
    rows = mine[keep]
    lengths = (
        ("input_len", scope.input_len, "--input-len"),
        ("output_len", scope.output_len, "--output-len"),
    )
    for col, want, flag in lengths:
        if want is not None:
            hit = rows[rows[col].astype(int) == want]
            if hit.empty:
                raise UsageError(
                    f"no decode row of {model} with {flag} {want} (input/output lengths stored: "
                    f"{_listed(_pairs(rows))})",
                    f"pass {flag} from those",
                )
            rows = hit
    pairs = _pairs(rows)
    if len(pairs) > 1:
        i, o = pairs[0]
        raise UsageError(
            f"the stores hold {model} at several input/output lengths ({_listed(pairs)}), and their tokens/s "
            "are different workloads",
            f"pass the one to plan at, e.g. --input-len {i} --output-len {o}",
        )
    return rows


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
    input_len: int | None = None
    output_len: int | None = None
    why: str = ""
    alternatives: list[str] = field(default_factory=list)

    def total_watts(self) -> float | None:
        """The devices' power together, where it was measured."""
        if self.devices is None or self.watts_per_device is None:
            return None
        return self.devices * self.watts_per_device


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


OBJECTIVES = ("devices", "watts")


def _watts(r: dict[str, Any]) -> float | None:
    """A row's power per device, J/token × decode tokens/s, where energy was measured."""
    j, dec = num(r.get("joules_per_token")), num(r.get("decode_tokens_per_s"))
    return j * dec if j == j and dec == dec else None


def _total_watts(r: dict[str, Any], target: float) -> float:
    w = _watts(r)
    return math.inf if w is None else w * math.ceil(target / num(r["output_tokens_per_s"]))


def plan_decode(
    tab: pd.DataFrame,
    model: str,
    target_tok_s: float,
    tpot_slo_s: float,
    ttft_slo_s: float,
    scope: DecodeScope = DecodeScope(),
    objective: str = "devices",
) -> list[DecodePlanRow]:
    """Per device kind holding decode rows of ``model``, fewest devices (or watts) first (module docstring)."""
    if not target_tok_s > 0 or not math.isfinite(target_tok_s):
        raise UsageError(
            f"--target-tok-s {target_tok_s!r} is not a positive rate", "pass e.g. --target-tok-s 8000"
        )
    if target_tok_s > MAX_TARGET_TOK_S:  # 1e40 planned 4.6e36 devices and exited 0
        raise UsageError(
            f"--target-tok-s {target_tok_s:g} is over {MAX_TARGET_TOK_S:g} tokens/s, more than any fleet serves",
            "pass e.g. --target-tok-s 8000",
        )
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown --objective {objective!r}", "use devices or watts")
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
    mine = scoped(mine, model, scope)
    out = [
        _platform_row(str(plat), rows, target_tok_s, tpot_slo_s, ttft_slo_s, objective)
        for plat, rows in mine.groupby("platform", sort=True)
    ]
    if objective == "watts":
        return sorted(
            out, key=lambda r: (r.devices is None, r.total_watts() is None, r.total_watts() or 0, r.platform)
        )
    return sorted(out, key=lambda r: (r.devices is None, r.devices or 0, r.platform))


def _platform_row(
    plat: str, rows: pd.DataFrame, target: float, tpot_slo_s: float, ttft_slo_s: float, objective: str
) -> DecodePlanRow:
    """One device kind's choice among its rows that meet the SLO, with every row it weighed."""
    ranked = rows.sort_values("output_tokens_per_s", ascending=False).to_dict("records")
    meets = [r for r in ranked if not misses(r, tpot_slo_s, ttft_slo_s)]
    row = DecodePlanRow(
        plat, input_len=int(rows["input_len"].iloc[0]), output_len=int(rows["output_len"].iloc[0])
    )
    row.alternatives = [
        f"{short(r)}: {num(r['output_tokens_per_s']):,.1f} tokens/s; "
        + ("; ".join(misses(r, tpot_slo_s, ttft_slo_s)) or "meets the SLO")
        for r in ranked
    ]
    if not meets:
        row.why = "none meets the SLO: " + "; ".join(
            f"{short(r)}: {', '.join(misses(r, tpot_slo_s, ttft_slo_s))}" for r in ranked[:1]
        )
        return row
    fewest_watts = objective == "watts" and any(_watts(r) is not None for r in meets)
    best = min(meets, key=lambda r: _total_watts(r, target)) if fewest_watts else meets[0]
    rate = num(best["output_tokens_per_s"])
    row.configuration = short(best)
    row.tokens_per_s_per_device = rate
    row.devices = math.ceil(target / rate)
    row.watts_per_device = _watts(best)
    row.tpot_tail_ms, row.tpot_tail_label = num(best["tpot_tail_ms"]), str(best.get("tpot_tail_label"))
    row.ttft_median_ms = num(best["ttft_median_ms"])
    chosen = "the fewest watts in all" if fewest_watts else "the fastest"
    if objective == "watts" and not fewest_watts:
        chosen += " (no power measured here, so not by watts)"
    row.why = (
        f"⌈{target:,.0f} ÷ {rate:,.1f} output tokens/s per device⌉ = {row.devices}; {chosen} of "
        f"{len(meets)} configuration(s) within TPOT ≤ {tpot_slo_s * 1e3:g} ms and TTFT ≤ "
        f"{ttft_slo_s * 1e3:g} ms"
    )
    return row
