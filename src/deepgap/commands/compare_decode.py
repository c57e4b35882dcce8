"""``deepgap compare``'s decode part: each side's decode rows, aggregated, filtered as the forward rows are.

The arithmetic is `deepgap.analysis.decode_compare`'s; this module reads the open stores and the flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from deepgap.core.errors import UsageError


def decode_side(store: Any, run_ids: list[str] | None, args: argparse.Namespace, platform: str | None = None):
    """One side's decode configurations (`analysis.decode.decode_agg`) of the models, precisions and platform asked."""
    from deepgap.analysis.decode import decode_agg
    from deepgap.analysis.platforms import resolve_platform

    agg = decode_agg(store.decode_frame(run_ids), store.samples)
    for col, text in (("model", args.model), ("precision", args.precision)):
        if text and len(agg):
            names = {t.strip() for t in text.split(",") if t.strip()}
            agg = agg[[str(v) in names for v in agg[col]]]
    if platform and len(agg):
        try:
            name = resolve_platform(platform, sorted(map(str, set(agg["platform"]))))
        except UsageError:  # the platform has forward rows only on this side: no decode row to compare
            return agg.iloc[0:0]
        agg = agg[agg["platform"] == name]
    return agg


def label(side_label: str, forward, decode) -> str:
    """A side's label naming the platforms of its decode rows where it has no forward rows."""
    if len(forward) or not len(decode):
        return side_label
    names = ", ".join(sorted(map(str, set(decode["platform"]))))
    return side_label.replace(" (no results)", f" ({names}; decode rows)")
