"""The paper's published numbers, shipped as package data so comparisons work offline.

``deepgap_paper_peaks.csv``: Table I of the DEEP-GAP paper (peak batch, peak images/s and speedup over
its CPU for T4, L4 and a 24-thread Xeon 6 Granite Rapids). (The paper's GPUs' theoretical peaks, its
Table III, are rows of the one datasheet, ``gpu_specs.csv``: `deepgap.roofline.specs`.) These are the
paper's numbers, not ours: the paper publishes no samples, so a ratio against it carries only our side's
uncertainty.
"""

from __future__ import annotations

from importlib import resources

import pandas as pd

PAPER_SOURCE = "DEEP-GAP (arXiv:2604.14552) Table I"


def _read(name: str) -> pd.DataFrame:
    with resources.files("deepgap").joinpath("data", name).open("r", encoding="utf-8") as fh:
        return pd.read_csv(fh)


def paper_peaks() -> pd.DataFrame:
    """Paper Table I: platform, precision, engine, model, peak_batch, peak_images_per_s, speedup_vs_cpu."""
    return _read("deepgap_paper_peaks.csv")
