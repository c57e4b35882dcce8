"""Per-token figures of text models: tokens/s and joules per token, derived from the per-sample ones.

Why derived and not measured apart: a text configuration's work is batch × sequence length, and in a
full-length batch every sample has the same length (no padding), so tokens/s is samples/s × ``seq_len`` and
J/token is J/sample ÷ ``seq_len`` exactly — from the same timed latencies and the same energy-counter window
(`deepgap.analysis.flags.telemetry_of`). Storing them would store one number twice. A mixed-length batch
(``--inputs packed``/``padded``) stores its real tokens per sequence (``tokens_per_sample``, from
`deepgap.core.result_details.TextBatch`), and that, not its ``seq_len`` cap, is what is multiplied: padding is
never counted as tokens. An image model has ``seq_len`` 0 ("not applicable") and these columns are NaN for it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from deepgap.core.stats import finite_or_none
from deepgap.render.units import seq_len_of  # one reading of a stored length, for every layer

__all__ = ["PER_TOKEN", "add_per_token", "per_token", "seq_len_of", "tokens_of"]

# derived column → (per-sample column, multiply (True) or divide by seq_len)
PER_TOKEN = {
    "tokens_per_s": ("throughput_ips", True),
    "tokens_ci_low_per_s": ("throughput_ci_low_ips", True),
    "tokens_ci_high_per_s": ("throughput_ci_high_ips", True),
    "joules_per_token": ("joules_per_image", False),
}


def per_token(row: dict[str, Any] | pd.Series) -> dict[str, float]:
    """The `PER_TOKEN` figures of one row (NaN where the row is not a text model's or lacks the figure)."""
    s = tokens_of(row)
    out = {}
    for name, (col, times) in PER_TOKEN.items():
        v = finite_or_none(row.get(col))
        out[name] = math.nan if not s or v is None else (v * s if times else v / s)
    return out


def tokens_of(row: dict[str, Any] | pd.Series) -> float:
    """Real tokens per sample: a mixed-length batch's mean length, else the sequence length (0: an image)."""
    real = finite_or_none(row.get("tokens_per_sample"))
    if real is not None and real > 0 and seq_len_of(row.get("seq_len")):
        return real
    return seq_len_of(row.get("seq_len"))


def add_per_token(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the `PER_TOKEN` columns added (in place, and returned)."""
    rows = [per_token(r) for r in df.to_dict("records")]
    for name in PER_TOKEN:
        df[name] = [r[name] for r in rows]
    return df
