"""The report's card-to-card section: how far cards of one GPU type are apart on the same configuration.

Registered in `deepgap.render.sections` like the platforms section. From the prepared measurements
(`ReportContext.results`, whose ``card`` is each GPU's UUID from the fingerprint): one row per platform
and configuration measured on two or more cards (``deepgap run --devices all --every-card``, or stores of
several cards merged), with each card's median throughput, the spread between the slowest and the fastest
card, and the coefficient of variation; and one row per platform with the card-to-card spread by which
``compare``, ``plan`` and the report's one-card intervals are widened (`deepgap.analysis.cards`). A store
with one card per platform gives nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from deepgap.analysis.cards import KEYS, per_card, platform_spread
from deepgap.analysis.frame import config_label
from deepgap.render.formatting import fmt_ips, pct_cell
from deepgap.render.sections import Parts, ReportContext, Section, register

TABLE_SPECS: dict[str, tuple[str, list[tuple[str, Any]]]] = {
    "card_spread": (
        "Card to card: the same configuration on each card of a GPU type (median images/s per card)",
        [
            ("platform", "platform"),
            ("configuration", "configuration"),
            ("cards", "n_cards"),
            ("per card images/s", "per_card"),
            ("slowest", lambda r: fmt_ips(r.get("slowest_ips"))),
            ("fastest", lambda r: fmt_ips(r.get("fastest_ips"))),
            ("fastest / slowest − 1", pct_cell("spread", ".1f")),
            ("CV between cards", pct_cell("cv", ".1f")),
        ],
    ),
    "card_spread_platforms": (
        "Card-to-card spread per GPU type: what compare, plan and one-card intervals are widened by",
        [
            ("platform", "platform"),
            ("spread (1 SD)", pct_cell("rel_sd", ".1f")),
            ("configurations", "n_configurations"),
            ("cards", "n_cards"),
        ],
    ),
}


def spread_rows(results: pd.DataFrame) -> pd.DataFrame:
    """One row per platform and configuration measured on two or more cards (OK, unflagged rows)."""
    if results.empty or "card" not in results:
        return pd.DataFrame()
    ok = results[(results["status"] == "ok") & ~results["flagged"].astype(bool)]
    rows = []
    for _, cfg in ok.groupby(["platform", *[k for k in KEYS if k in ok]], sort=True, dropna=False):
        meds = per_card(cfg)
        if len(meds) < 2:
            continue
        v = np.array(list(meds.values()))
        first = cfg.iloc[0]
        rows.append(
            {
                "platform": first["platform"],
                "configuration": config_label(first, with_platform=False),
                "n_cards": len(meds),
                "per_card": ", ".join(f"{x:,.0f}" for x in sorted(v)),
                "slowest_ips": float(v.min()),
                "fastest_ips": float(v.max()),
                "spread": float(v.max() / v.min() - 1),
                "cv": float(v.std(ddof=1) / v.mean()),
            }
        )
    return pd.DataFrame(rows)


def build(ctx: ReportContext) -> Parts:
    """The section's part of one report build (nothing without a configuration on two or more cards)."""
    rows = spread_rows(ctx.results)
    if rows.empty:
        return Parts()
    plat = pd.DataFrame([vars(s) for s in platform_spread(ctx.results).values()])
    return Parts({"card_spread": rows, "card_spread_platforms": plat})


SECTION = register(Section("card_spread", 27, build, TABLE_SPECS))
