"""The ``accuracy-loss`` flag, and the evidence behind it: a dataset's top-1, or an agreement with its n.

The constraint is top-1 relative to fp32, MLPerf's rule: a quantized result counts only at ≥ 99% of
the fp32 model's top-1. Two kinds of evidence can break it:

- **A labelled dataset** (``--dataset``, ``extra['accuracy']``): top-1 against the labels divided by the
  fp32 reference's top-1 on the same images. This is what the bar was made for.
- **Top-1 agreement with fp32 on the correctness check's inputs** (``extra['correctness']``): the share
  of the check's few synthetic inputs (1 at batch 1, 8 at larger batches) whose predicted class the
  engine keeps. It counts only where it *can* speak of accuracy and its binomial interval excludes the
  bar: the weights must be a trained state dict (``--weights``), at least `MIN_AGREEMENT_N` inputs, and
  the Clopper-Pearson 95% interval's upper end below the bar. With seeded random weights (the default)
  the logits carry no class information: the top-1 of a random network is decided by near-ties that any
  rounding flips, so the agreement measures tie-breaking, not accuracy — ResNet-101 int8 at relL2 0.017
  scored 0/1 in one sweep and 1/1 in another. Those rows are bounded by relL2 and cosine instead
  (`deepgap.measure.correctness`, the ``wrong-output`` flag), and their agreement is shown with its n and
  interval, labelled "on synthetic inputs, random weights". The same seeded inputs are used in every
  sweep, so repeats do not add to n.

Which configurations are held to the bar: the quantized precisions (int8, fp8: ``quantized`` in
`deepgap.core.precision.PRECISIONS`) by default (``DEFAULT_MIN``); every precision when the user sets a
minimum (``--min-accuracy`` at run time, stored as ``extra['min_accuracy']``, or at analysis time, which
overrides the stored one); none with ``--min-accuracy off`` (stored as 0). A flagged configuration is
never recommended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deepgap.core.precision import is_quantized
from deepgap.core.result_details import ResultDetails
from deepgap.core.stats import finite_or_none as _num

DEFAULT_MIN = 0.99
OFF = 0.0  # --min-accuracy off: no bar for any precision
FLAG = "accuracy-loss"
COLUMNS = ("top1", "top5", "top1_relative", "top1_agreement_fp32")
# Fewest check inputs whose agreement may back a flag: below it one near-tie decides the verdict.
MIN_AGREEMENT_N = 10
CONFIDENCE = 0.95
WEIGHTS_TRAINED = "state-dict"  # `Correctness.weights` of a run with --weights; "random" otherwise


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact two-sided binomial interval of ``k`` successes in ``n`` trials (scipy's beta quantiles)."""
    from scipy.stats import beta

    if n <= 0:
        return 0.0, 1.0
    a = 1.0 - confidence
    lo = 0.0 if k <= 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k >= n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class Agreement:
    """Top-1 agreement with fp32 on the check inputs: k of n, its interval, and what the inputs were."""

    k: int
    n: int  # 0: not recorded (a hand-built or old row): the share alone is known, with no interval
    low: float
    high: float
    weights: str  # "random", "state-dict", or "" (not recorded: a store from before it was)
    value: float  # the share k / n

    @property
    def speaks_to_accuracy(self) -> bool:
        """Whether it may back an accuracy flag: trained weights and enough inputs (module docstring)."""
        return self.weights == WEIGHTS_TRAINED and self.n >= MIN_AGREEMENT_N

    def label(self) -> str:
        """'top-1 agreement 0/8 [0%, 37%] on synthetic inputs, random weights'."""
        w = {"random": "random weights", WEIGHTS_TRAINED: "trained weights"}.get(
            self.weights, "weights not recorded: random unless the run had --weights"
        )
        if not self.n:
            return f"top-1 agreement {100 * self.value:.1f}% (n not recorded) on synthetic inputs, {w}"
        return (
            f"top-1 agreement {self.k}/{self.n} [{100 * self.low:.0f}%, {100 * self.high:.0f}%] "
            f"on synthetic inputs, {w}"
        )


def agreement(top1: Any, n: Any, weights: Any = "") -> Agreement | None:
    """The agreement of ``top1`` (a share) over ``n`` inputs (n unknown: the share, no interval), or None."""
    v = _num(top1)
    if v is None:
        return None
    n_i = int(_num(n) or 0)
    k = int(round(v * n_i))
    lo, hi = clopper_pearson(k, n_i) if n_i else (float("nan"), float("nan"))
    return Agreement(k, n_i, lo, hi, str(weights or ""), v)


def check_agreement(extra: ResultDetails | dict[str, Any] | None) -> Agreement | None:
    """The correctness check's agreement of one measurement, or None when it stored none."""
    corr = ResultDetails.of(extra).correctness
    if corr is None:
        return None
    return agreement(corr.top1_agreement, corr.n_images, corr.get("weights"))


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
    """The minimum that applies: the analysis's, else the run's stored one, else 99% if quantized, or none.

    0 (``--min-accuracy off``) means no bar: it is returned as None.
    """
    if min_accuracy is not None:
        return min_accuracy if min_accuracy > OFF else None
    stored = _num(ResultDetails.of(extra).min_accuracy)
    if stored is not None:
        return stored if stored > OFF else None
    return DEFAULT_MIN if is_quantized(precision) else None


def flags(
    precision: str, extra: ResultDetails | dict[str, Any] | None, min_accuracy: float | None = None
) -> list[str]:
    """``['accuracy-loss(...)']`` when the evidence puts the configuration below its bar, else []."""
    bar = threshold(str(precision), extra, min_accuracy)
    value, kind = figure(extra)
    if bar is None or value is None:
        return []
    if kind == "dataset":
        if value >= bar - 1e-12:
            return []
        acc = ResultDetails.of(extra).accuracy
        top1, n = _num(acc.top1), _num(acc.get("n"))
        of_n = f" of {int(n)} images" if n else ""
        what = (
            f"top1 {100 * top1:.2f}%{of_n} = {100 * value:.1f}% of fp32"
            if top1 is not None
            else f"{100 * value:.1f}% of fp32"
        )
        return [f"{FLAG}({what} < {100 * bar:g}%)"]
    ag = check_agreement(extra)
    if ag is None or not ag.speaks_to_accuracy or ag.high >= bar:
        return []
    return [f"{FLAG}({ag.label()}, interval below {100 * bar:g}%)"]


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
    """'99%' or '0.99' → 0.99; 'off' → 0 (no bar); a `UsageError` for anything outside (0, 1]."""
    from deepgap.core.errors import UsageError
    from deepgap.drive.config import parse_percent

    if str(text).strip().lower() == "off":
        return OFF
    v = parse_percent(text)
    if v is None or not 0 < v <= 1 or math.isnan(v):
        raise UsageError(
            f"--min-accuracy {text!r} is not a fraction in (0, 1] nor 'off'", "pass e.g. --min-accuracy 99%"
        )
    return v
