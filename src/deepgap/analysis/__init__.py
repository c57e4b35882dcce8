"""Analysis: pure functions from a results DataFrame to the study's tables, comparisons and advice.

Kept apart from rendering (`deepgap.report.page` draws and writes; it computes nothing). Every function
takes DataFrames (and, for ratio CIs, a function that returns raw samples) and returns DataFrames
or dataclasses, so each is tested on hand-built stores without measuring anything.

- `frame`: flags, and the aggregation of sweep passes/runs into one row per configuration.
- `tables`: Table I, speedups over FP32 and over the CPU, Pareto frontier, energy, thread scaling.
- `compare`: speedup of A over B with bootstrap CIs of ratios; the paper's Table I beside yours.
- `platforms`: two platforms of one merged store side by side, with the roofline's predicted ratios.
- `recommend`: the best configuration under a P99 SLO and a memory cap.
- `reference`: the paper's published numbers, shipped as package data.
"""

from __future__ import annotations

from deepgap.analysis.flags import row_flags
from deepgap.analysis.frame import aggregate, config_label, failures, prepare

__all__ = ["aggregate", "config_label", "failures", "prepare", "row_flags"]
