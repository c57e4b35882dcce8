"""Phrases that every layer prints the same way, so that a number means one thing in every view.

Why: a forward's median latency is a whole batch's. The console said so after session 25, but
``recommend`` still printed "median 0.865 ms per sequence" for a batch of 8 (0.108 ms a sequence).
One function now words it for the console (`deepgap.drive.progress`) and for ``recommend``.
"""

from __future__ import annotations


def latency_words(median_s: float, batch: int, item: str | None) -> str:
    """``median_s`` of one forward of ``batch`` items, worded with what it is per item.

    ``item`` is "sequence" for a text model; None leaves an image row's line as it always read (its
    batch stands beside it in the configuration's label).
    """
    ms = median_s * 1e3
    if not item:
        return f"{ms:.3f} ms"
    if batch == 1:
        return f"{ms:.3f} ms per {item}"
    return f"{ms:.3f} ms per batch of {batch} ({ms / batch:.4f} ms per {item})"
