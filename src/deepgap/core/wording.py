"""Phrases that every layer prints the same way, so that a number means one thing in every view.

Why: a forward's median latency is a whole batch's. The console said so after session 25, but
``recommend`` still printed "median 0.865 ms per sequence" for a batch of 8 (0.108 ms a sequence).
One function now words it for the console (`deepgap.drive.progress`) and for ``recommend``.
"""

from __future__ import annotations


def latency_words(
    median_s: float, batch: int, item: str | None, spec: tuple[str, str] = (".3f", ".4f")
) -> str:
    """``median_s`` of one forward of ``batch`` items, worded with what it is per item.

    ``item`` is "sequence" for a text model, "image" for an image model; None leaves the line as the
    console always printed an image row (its batch stands beside it in the configuration's label).
    ``spec``: the format of the batch's milliseconds and of an item's.
    """
    ms = median_s * 1e3
    whole, each = spec
    if not item:
        return f"{ms:{whole}} ms"
    if batch == 1:
        return f"{ms:{whole}} ms per {item}"
    return f"{ms:{whole}} ms per batch of {batch} ({ms / batch:{each}} ms per {item})"
