"""Fig. 11's caption names the memory format(s) it plots, and which rows divide by FP32 of another format.

Why: the default GPU grid puts quant int8/fp8 in channels_last beside eager fp16 in NCHW, and the quant rows
divide by eager FP32 in NCHW (none in channels_last); the caption said "at the same … memory format" of every
row, which those rows are not, and never said which formats the figure holds.
"""

from __future__ import annotations

import pandas as pd

from deepgap.report import figures_batch


def _row(engine: str, precision: str, fmt: str, base_fmt: str) -> dict:
    return {
        "platform": "NVIDIA H200",
        "device": "cuda",
        "model": "resnet50",
        "engine": engine,
        "precision": precision,
        "memory_format": fmt,
        "threads": 0,
        "include_transfer": False,
        "batch_size": 256,
        "speedup": 3.0,
        "baseline_engine": "eager",
        "baseline_memory_format": base_fmt,
        "flagged": False,
        "flags": [],
        "warnings": [],
    }


def test_mixed_formats_are_named_with_their_baselines():
    sp = pd.DataFrame(
        [
            _row("eager", "fp16", "nchw", "nchw"),
            _row("quant", "int8", "channels_last", "nchw"),
            _row("quant", "fp8", "channels_last", "nchw"),
        ]
    )
    cap = figures_batch.speedup_vs_fp32(sp).caption
    assert "Memory formats plotted: channels_last (dashed) and nchw (solid)." in cap
    assert "quant int8, fp8 in channels_last over eager FP32 in nchw" in cap
    assert "at the same platform, batch, memory format" not in cap  # not said of every row any more


def test_one_format_says_so():
    sp = pd.DataFrame([_row("eager", "fp16", "nchw", "nchw"), _row("eager", "bf16", "nchw", "nchw")])
    cap = figures_batch.speedup_vs_fp32(sp).caption
    assert "Memory format plotted: nchw (solid). Each row is over FP32 in its own format." in cap
    assert "channels_last" not in cap
