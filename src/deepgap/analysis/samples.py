"""Raw per-iteration latencies of several results pooled into one array, read lazily from a store.

The analysis (bootstrap CIs of pooled groups, platform comparisons) asks for samples by result id; this
keeps the store behind a plain function so that the analysis never holds the store itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def pooled_samples_fn(store: Any) -> Callable[[list[int]], Any]:
    """A function: result ids → their raw per-iteration latencies from ``store``, pooled (empty if none)."""
    import numpy as np

    def fn(ids: list[int]):
        arrs = [a for rid in ids for a in store.samples(int(rid))]
        return np.concatenate(arrs) if arrs else np.empty(0)

    return fn
