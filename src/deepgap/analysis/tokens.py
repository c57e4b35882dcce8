"""Per-token figures of text models: tokens/s and joules per token, derived from the per-sample ones.

Why derived and not measured apart: a text configuration's work is batch × sequence length, and every
sample of a batch has the same length (no padding), so tokens/s is samples/s × ``seq_len`` and J/token is
J/sample ÷ ``seq_len`` exactly — from the same timed latencies and the same energy-counter window
(`deepgap.analysis.flags.telemetry_of`). Storing them would store one number twice. An image model has
``seq_len`` 0 ("not applicable") and these columns are NaN for it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from deepgap.core.stats import finite_or_none
from deepgap.render.units import seq_len_of  # one reading of a stored length, for every layer

__all__ = ["PER_TOKEN", "add_per_token", "per_token", "seq_len_of"]

# derived column → (per-sample column, multiply (True) or divide by seq_len)
PER_TOKEN = {
    "tokens_per_s": ("throughput_ips", True),
    "tokens_ci_low_per_s": ("throughput_ci_low_ips", True),
    "tokens_ci_high_per_s": ("throughput_ci_high_ips", True),
    "joules_per_token": ("joules_per_image", False),
}


def per_token(row: dict[str, Any] | pd.Series) -> dict[str, float]:
    """The `PER_TOKEN` figures of one row (NaN where the row is not a text model's or lacks the figure)."""
    s = seq_len_of(row.get("seq_len"))
    out = {}
    for name, (col, times) in PER_TOKEN.items():
        v = finite_or_none(row.get(col))
        out[name] = math.nan if not s or v is None else (v * s if times else v / s)
    return out


def add_per_token(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the `PER_TOKEN` columns added (in place, and returned)."""
    rows = [per_token(r) for r in df.to_dict("records")]
    for name in PER_TOKEN:
        df[name] = [r[name] for r in rows]
    return df
