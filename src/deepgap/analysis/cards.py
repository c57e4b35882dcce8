"""Card-to-card spread: one card is not the GPU type.

ResNet-50 compile-freeze fp16 bs256 measured 29.6k, 30.3k, 30.8k and 31.9k img/s on four H200s (different
cards and days), while ``compare`` gave the H200/H100 ratio as 1.31× [1.31×, 1.32×]: an interval over one
card's processes, not over the next card a user buys (issue 34). A measurement's card is its GPU's UUID
(else serial) from the environment fingerprint (the store's ``card`` column; redacted like every
identifier, which keeps cards apart). Where a platform's store holds two or more cards:

- a configuration measured on two or more cards gets its throughput CI from the three-level bootstrap
  (`deepgap.core.stats.card_bootstrap`: cards, then processes, then samples) — `throughput_ci`;
- the platform's card-to-card spread (`platform_spread`: the median over those configurations of the
  coefficient of variation between the cards' median throughputs) widens every other interval of that
  platform — a configuration measured on one card (`widen`), a ``compare`` ratio (`widen_interval`) and
  ``plan``'s device count — so that they speak for the GPU type, not for one card.

A one-card store has no spread to widen by; its intervals cover that card's processes only (docs/fleets.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from deepgap.analysis.sweeps import SamplesFn, process_samples, rate_ci
from deepgap.core.stats import card_bootstrap, card_bootstrap_ci

Z95 = 1.959964
KEYS = [
    "model",
    "engine",
    "precision",
    "batch_size",
    "memory_format",
    "threads",
    "resolution",
    "include_transfer",
    "input_mode",  # a resident input (core.records.INPUT_MODES) is never pooled with the default one
]


@dataclass(frozen=True)
class Spread:
    """A platform's card-to-card spread: relative SD of a card's median throughput, and its evidence."""

    platform: str
    rel_sd: float
    n_configurations: int
    n_cards: int

    def text(self) -> str:
        """``card-to-card spread ±2.1% (1 SD, median of 3 configuration(s) on 4 cards)``."""
        return (
            f"card-to-card spread ±{100 * self.rel_sd:.1f}% (1 SD, median of {self.n_configurations} "
            f"configuration(s) on {self.n_cards} cards)"
        )


def card_ids(frame: pd.DataFrame) -> pd.Series:
    """Each row's card, "" where unknown (a CPU, an old store, NVML unavailable)."""
    if "card" not in frame:
        return pd.Series([""] * len(frame), index=frame.index, dtype=object)
    known = ["" if not isinstance(c, str) or c.startswith("unavailable") else c for c in frame["card"]]
    return pd.Series(known, index=frame.index, dtype=object)  # not Series.map: 3 calls per configuration


def per_card(used: pd.DataFrame) -> dict[str, float]:
    """Median throughput per known card of one configuration's measurements."""
    cards = card_ids(used)
    tp = pd.to_numeric(used["throughput_ips"], errors="coerce")
    out = {}
    for card in sorted(set(cards) - {""}):
        v = tp[cards == card].dropna()
        if len(v):
            out[card] = float(v.median())
    return out


def throughput_ci(used: pd.DataFrame, samples: SamplesFn) -> tuple[float, float, str] | None:
    """Throughput CI by the three-level bootstrap when the measurements come from two or more cards."""
    cards = card_ids(used)
    if len(set(cards) - {""}) < 2:
        return None
    by_card = (
        process_samples(used.loc[cards == card, "result_id"], samples) for card in sorted(set(cards) - {""})
    )
    nested = [procs for procs in by_card if procs]
    if len(nested) < 2:
        return None
    n = sum(len(p) for p in nested)
    how = f"three-level bootstrap over {len(nested)} cards, then {n} processes, then samples"
    return rate_ci(used, *card_bootstrap_ci(nested), how)


def result_ids_by_card(used: pd.DataFrame) -> list[list[int]]:
    """The result ids of one configuration's measurements, per known card ([] with fewer than two cards)."""
    cards = card_ids(used)
    known = sorted(set(cards) - {""})
    if len(known) < 2 or "result_id" not in used:
        return []
    return [[int(r) for r in used.loc[cards == c, "result_id"]] for c in known]


def ratio_ci(
    ids_a: list[list[int]],
    ids_b: list[list[int]],
    samples_a: Callable[[list[int]], np.ndarray],
    samples_b: Callable[[list[int]], np.ndarray],
    n_resamples: int = 1000,
) -> tuple[float, float]:
    """95% CI of the speed ratio A/B (median latency B / median latency A) by the three-level bootstrap.

    ``ids_x``: each side's result ids per card (a one-card side: one list); each result is one process.
    The two sides are resampled independently (`deepgap.core.stats.card_bootstrap`).
    """
    dists = []
    for ids, fn, seed in ((ids_a, samples_a, 1), (ids_b, samples_b, 2)):
        nested = [[fn([rid]) for rid in card] for card in ids]
        dists.append(card_bootstrap(nested, n_resamples=n_resamples, seed=seed))
    if not (dists[0].size and dists[1].size):
        return float("nan"), float("nan")
    lo, hi = np.quantile(dists[1] / dists[0], [0.025, 0.975])
    return float(lo), float(hi)


def platform_spread(frame: pd.DataFrame) -> dict[str, Spread]:
    """Per platform with configurations measured on two or more cards, its card-to-card `Spread`.

    ``frame``: prepared measurements (`deepgap.analysis.frame.prepare`), OK and unflagged rows are used.
    """
    if frame.empty or "platform" not in frame:
        return {}
    keep = pd.Series(True, index=frame.index)
    if "status" in frame:
        keep &= frame["status"] == "ok"
    if "flagged" in frame:
        keep &= ~frame["flagged"].astype(bool)
    ok = frame[keep].copy()
    ok["card"] = card_ids(ok)
    ok = ok[ok["card"] != ""]
    out = {}
    keys = [k for k in KEYS if k in ok]
    for platform, grp in ok.groupby("platform", sort=True):
        cvs, cards = [], set()
        for _, cfg in grp.groupby(keys, sort=True, dropna=False):
            meds = list(per_card(cfg).values())
            if len(meds) >= 2 and np.mean(meds) > 0:
                cvs.append(float(np.std(meds, ddof=1) / np.mean(meds)))
                cards |= set(cfg["card"])
        if cvs:
            # the median, not the RMS: launch-bound small batches measured on other hosts and days vary by
            # 10-40% (host CPU, not card) and would set an RMS for every configuration (committed H100
            # stores, 52 configurations on 10 cards: median 1.6%, RMS 12.9%, batch 256 alone 0.6%)
            out[str(platform)] = Spread(str(platform), float(np.median(cvs)), len(cvs), len(cards))
    return out


def widen_interval(point: float, lo: float, hi: float, rel_sds: Sequence[float]) -> tuple[float, float]:
    """``[lo, hi]`` around ``point`` widened on the log scale by independent relative SDs (in quadrature)."""
    extra = sum((Z95 * s) ** 2 for s in rel_sds if s and s == s)
    if not extra or not (point > 0 and lo > 0 and hi > 0):
        return lo, hi
    down = math.sqrt(math.log(point / lo) ** 2 + extra) if lo < point else math.sqrt(extra)
    up = math.sqrt(math.log(hi / point) ** 2 + extra) if hi > point else math.sqrt(extra)
    return point * math.exp(-down), point * math.exp(up)


def widen(agg: pd.DataFrame, spreads: dict[str, Spread]) -> pd.DataFrame:
    """Aggregated configurations with ``card_spread_rel`` and the one-card intervals widened by it.

    A configuration measured on two or more cards keeps its three-level interval (it holds the spread);
    one measured on one card of a platform with a known spread gets its CI widened (`widen_interval`)
    and its ``ci_method`` says so.
    """
    if agg.empty or not spreads:
        return agg
    agg = agg.copy()
    agg["card_spread_rel"] = [spreads[p].rel_sd if p in spreads else float("nan") for p in agg["platform"]]
    for i, row in agg.iterrows():
        sp = spreads.get(row["platform"])
        if sp is None or int(row.get("n_cards") or 0) >= 2:
            continue
        lo, hi = widen_interval(
            row["throughput_ips"], row["throughput_ci_low_ips"], row["throughput_ci_high_ips"], [sp.rel_sd]
        )
        bs = float(row["batch_size"])
        agg.loc[i, ["throughput_ci_low_ips", "throughput_ci_high_ips"]] = [lo, hi]
        agg.loc[i, ["latency_median_ci_low_s", "latency_median_ci_high_s"]] = [bs / hi, bs / lo]
        agg.loc[i, "ci_method"] = f"{row['ci_method']}; widened by the {sp.text()}"
    return agg
