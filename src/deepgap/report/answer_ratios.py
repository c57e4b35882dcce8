"""The two-GPU answer: per model and goal, the fastest GPU's recommendation over each other GPU's.

Why apart from the answer (`deepgap.report.answer`, one row per model and goal): a store of two GPUs is
also asked "how much faster is A than B"; the ratio is computed here from the answer's own recommendations,
with each side's configuration named and a bootstrap interval where the samples allow one.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.analysis.recommend import OBJECTIVES, recommend
from deepgap.core.stats import finite_or_none as _f
from deepgap.render.formatting import fmt_x
from deepgap.report.answer import GOALS, _by_label, _row_of, _short


def _gpu_order(agg: pd.DataFrame) -> list[str]:
    """GPU platforms, the fastest (highest peak throughput) first: the answer's ratios put it on top."""
    gpu = agg[agg["device"].astype(str).str.startswith("cuda")] if "device" in agg else agg.iloc[0:0]
    return list(gpu.groupby("platform")["throughput_ips"].max().sort_values(ascending=False).index)


def _ci_ratio_text(point: float | None, lo: float | None, hi: float | None) -> str:
    if point is None:
        return "–"
    ci = f" [{fmt_x(lo)[:-1]}, {fmt_x(hi)[:-1]}]" if lo is not None and hi is not None else ""
    return f"{fmt_x(point)}{ci}"


def cross_gpu_ratios(agg: pd.DataFrame, samples_fn) -> pd.DataFrame:
    """The two-GPU answer: per model and goal, the fastest GPU's answer over each other GPU's answer.

    Why here: a store of two GPUs is asked "how much faster is A than B", so the ratio belongs beside
    the answer, not in a wide table at the end of the page. Each side is its platform's recommended
    configuration for that goal (`recommend`), so the ratio is "best vs best" unless both are the same
    configuration (then like with like); both configurations are named. Throughput and latency ratios
    carry a bootstrap 95% CI of the pooled raw latencies (`analysis.compare.throughput_ratio`); energy
    per image has no CI stored. ``samples_fn``: result ids → pooled latencies. Empty below two GPUs.
    """
    from deepgap.analysis.compare import throughput_ratio

    cols = [
        "model",
        "resolution",
        "platform_a",
        "platform_b",
        "goal",
        "ratio",
        "ci_low",
        "ci_high",
        "text",
        "basis",
        "configuration_a",
        "configuration_b",
    ]
    gpus = _gpu_order(agg) if not agg.empty else []
    rows: list[dict[str, Any]] = []
    for pb in gpus[1:]:
        pa = gpus[0]
        sa, sb = agg[agg["platform"] == pa], agg[agg["platform"] == pb]
        rows_a: dict[tuple, dict] = {}  # (model, resolution) → its rows by label, read once
        rows_b: dict[tuple, dict] = {}
        for obj in OBJECTIVES:
            ra_all = {(r.model, r.resolution): r for r in recommend(sa, obj)}
            rb_all = {(r.model, r.resolution): r for r in recommend(sb, obj)}
            for key in sorted(set(ra_all) & set(rb_all)):
                for s, labelled in ((sa, rows_a), (sb, rows_b)):
                    if key not in labelled:
                        labelled[key] = _by_label(s[(s["model"] == key[0]) & (s["resolution"] == key[1])])
                a, b = _row_of(rows_a[key], ra_all[key].choice), _row_of(rows_b[key], rb_all[key].choice)
                if a is None or b is None:
                    continue
                point = lo = hi = None
                if obj == "joules":
                    ja, jb = _f(a.get("joules_per_image")), _f(b.get("joules_per_image"))
                    point = ja / jb if ja and jb else None
                else:
                    t, tlo, thi, _ = throughput_ratio(a, b, samples_fn, samples_fn)
                    tlo, thi = _f(tlo), _f(thi)
                    if obj == "throughput":
                        point, lo, hi = _f(t), tlo, thi
                    elif _f(t):  # median latency A/B = (batch A / batch B) / throughput ratio
                        k = float(a["batch_size"]) / float(b["batch_size"])
                        point = k / t
                        lo, hi = (k / thi, k / tlo) if tlo and thi else (None, None)
                same = _short(a) == _short(b)
                rows.append(
                    {
                        "model": key[0],
                        "resolution": int(key[1]),
                        "platform_a": pa,
                        "platform_b": pb,
                        "goal": GOALS[obj],
                        "ratio": point,
                        "ci_low": lo,
                        "ci_high": hi,
                        "text": _ci_ratio_text(point, lo, hi),
                        "basis": "same configuration" if same else "best vs best",
                        "configuration_a": _short(a),
                        "configuration_b": _short(b),
                    }
                )
    return pd.DataFrame(rows, columns=cols)
