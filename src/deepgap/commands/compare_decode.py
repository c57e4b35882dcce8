"""``deepgap compare``'s decode part: each side's decode rows, aggregated, filtered as the forward rows are.

The arithmetic is `deepgap.analysis.decode_compare`'s; this module reads the open stores and the flags.
"""

from __future__ import annotations

import argparse
from typing import Any


def decode_side(store: Any, run_ids: list[str] | None, args: argparse.Namespace):
    """One side's decode configurations (`analysis.decode.decode_agg`) of the models and precisions asked.

    ``--platforms`` is applied by the caller, against the side's forward and decode rows together.
    """
    from deepgap.analysis.decode import decode_agg
    from deepgap.commands.filter_flags import keep_named

    return keep_named(decode_agg(store.decode_frame(run_ids), store.samples), args, ("model", "precision"))


def label(side_label: str, forward, decode) -> str:
    """A side's label naming the platforms of its decode rows where it has no forward rows."""
    if len(forward) or not len(decode):
        return side_label
    names = ", ".join(sorted(map(str, set(decode["platform"]))))
    return side_label.replace(" (no results)", f" ({names}; decode rows)")
