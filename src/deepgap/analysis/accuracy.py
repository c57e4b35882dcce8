"""The ``accuracy-loss`` flag: a configuration whose top-1 falls below the accuracy constraint.

The constraint is top-1 relative to fp32, MLPerf's rule: a quantized result counts only at ≥ 99% of
the fp32 model's top-1. With a labelled dataset (``extra['accuracy']``) the figure is top-1 against the
labels divided by the fp32 reference's top-1 on the same images. Without one, it is the correctness
check's top-1 agreement with fp32 on its fixed inputs (``extra['correctness']``): a quantized engine that
changes the predicted class of more than 1% of them fails the same bar.

Which configurations are held to it: the quantized precisions (int8, fp8: ``quantized`` in
`deepgap.precision.PRECISIONS`) by default (``DEFAULT_MIN``); every precision when the
user sets a minimum (``--min-accuracy`` at run time, stored as ``extra['min_accuracy']``, or at analysis
time, which overrides the stored one). A flagged configuration is never recommended.
"""

from __future__ import annotations

from typing import Any

from deepgap.precision import is_quantized
from deepgap.result_details import ResultDetails
from deepgap.stats import finite_or_none as _num

DEFAULT_MIN = 0.99
FLAG = "accuracy-loss"
COLUMNS = ("top1", "top5", "top1_relative", "top1_agreement_fp32")



def figure(extra: ResultDetails | dict[str, Any] | None) -> tuple[float | None, str]:
    """(top-1 relative to fp32, what it is): the dataset's where measured, else the correctness agreement."""
    extra = ResultDetails.of(extra)
    acc = extra.accuracy
    if acc is not None and _num(acc.top1_relative) is not None:
        return _num(acc.top1_relative), "dataset"
    corr = extra.correctness
    if corr is not None and _num(corr.top1_agreement) is not None:
        return _num(corr.top1_agreement), "agreement"
    return None, ""


def threshold(
    precision: str, extra: ResultDetails | dict[str, Any] | None, min_accuracy: float | None = None
) -> float | None:
    """The minimum that applies: the analysis's, else the run's stored one, else 99% if quantized, or none."""
    if min_accuracy is not None:
        return min_accuracy
    stored = _num(ResultDetails.of(extra).min_accuracy)
    if stored is not None:
        return stored
    return DEFAULT_MIN if is_quantized(precision) else None


def flags(
    precision: str, extra: ResultDetails | dict[str, Any] | None, min_accuracy: float | None = None
) -> list[str]:
    """``['accuracy-loss(...)']`` when the configuration's figure is below its threshold, else []."""
    bar = threshold(str(precision), extra, min_accuracy)
    value, kind = figure(extra)
    if bar is None or value is None or value >= bar - 1e-12:
        return []
    if kind == "dataset":
        top1 = _num(ResultDetails.of(extra).accuracy.top1)
        what = (
            f"top1 {100 * top1:.2f}% = {100 * value:.1f}% of fp32"
            if top1 is not None
            else f"{100 * value:.1f}% of fp32"
        )
    else:
        what = f"top1 agreement {100 * value:.1f}% on the check inputs"
    return [f"{FLAG}({what} < {100 * bar:g}%)"]


def columns(extra: ResultDetails | dict[str, Any] | None) -> dict[str, float]:
    """The dataset accuracy figures of one measurement (absent keys dropped): show, report data, recommend."""
    acc = ResultDetails.of(extra).accuracy
    if acc is None:
        return {}
    return {k: v for k in COLUMNS if (v := _num(acc.get(k))) is not None}


def reflag(df, min_accuracy: float | None):
    """A `prepare`-d frame with every ``accuracy-loss`` flag recomputed against ``min_accuracy``."""
    if df.empty or min_accuracy is None:
        return df
    df = df.copy()
    extras = df["extra"] if "extra" in df else [{}] * len(df)
    df["flags"] = [
        [f for f in fl if not f.startswith(FLAG)] + flags(p, e, min_accuracy)
        for fl, p, e in zip(df["flags"], df["precision"], extras, strict=True)
    ]
    df["flagged"] = [bool(f) for f in df["flags"]]
    return df


def parse_min_accuracy(text: str) -> float:
    """'99%' or '0.99' → 0.99; a `UsageError` for anything outside (0, 1]."""
    from deepgap.config import parse_percent
    from deepgap.errors import UsageError

    v = parse_percent(text)
    if v is None or not 0 < v <= 1:
        raise UsageError(
            f"--min-accuracy {text!r} is not a fraction in (0, 1]", "pass e.g. --min-accuracy 99%"
        )
    return v
