"""The grid's real gaps: which batch sizes each measured engine and precision never ran.

"not measured, and why" used to list only failed configurations, so a grid whose engines ran at
different batch sizes by design (the ``gpu`` preset: compile-freeze only at batch 256, cudagraph only
at batch 1, quant then at 1 and 256, now at 1 and 1024) said "nothing missing" while its answers compared
engines over different batches. Here the batch sizes measured for a model (any engine) are the grid, and every
(engine, precision, memory format) that ran is checked against it; a batch that failed is left to the
failure list, which has its reason.
"""

from __future__ import annotations

import pandas as pd

KEY = ["engine", "precision", "memory_format"]


def grid_gaps(measured: pd.DataFrame, failed: pd.DataFrame | None = None) -> list[str]:
    """'compile-freeze fp16 channels_last: only bs256; never bs1, bs32 (not in the run's grid)' per gap.

    ``measured``: one platform's aggregated configurations of one model; ``failed``: its failures.
    """
    if measured.empty:
        return []
    grid = sorted({int(b) for b in measured["batch_size"]})
    tried: set[tuple] = set()
    if failed is not None and len(failed):
        tried = {(*(str(r[k]) for k in KEY), int(r["batch_size"])) for r in failed.to_dict("records")}
    out = []
    for key, g in measured.groupby(KEY, sort=True):
        have = sorted({int(b) for b in g["batch_size"]})
        never = [b for b in grid if b not in have and (*map(str, key), b) not in tried]
        if never:
            fmt = "" if key[2] == "nchw" else f" {key[2]}"
            out.append(
                f"{key[0]} {key[1]}{fmt}: only {', '.join(f'bs{b}' for b in have)}; never "
                f"{', '.join(f'bs{b}' for b in never)} (not in the run's grid)"
            )
    return out
