"""The answer's accuracy cell: the worst stored check of a configuration against fp32, in one line.

Why apart from `deepgap.report.answer`: the evidence behind a quantized or text answer (rel. L2, cosine,
top-1 agreement with its n and interval, what weights it was measured with) is read the same way by the
answer and its "how sure" table; the answer module keeps the choice of rows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from deepgap.analysis.flags import degenerate
from deepgap.core.result_details import Correctness, ResultDetails
from deepgap.core.stats import finite_or_none as _f


def accuracy_by_result(df: pd.DataFrame) -> dict[int, Correctness]:
    """Result id → its stored correctness check (rel. L2, cosine, top-1 agreement against FP32)."""
    if df.empty or "extra" not in df:
        return {}
    out = {}
    for rid, extra in zip(df["result_id"], df["extra"], strict=False):
        corr = ResultDetails.of(extra).correctness
        if corr is not None:
            out[int(rid)] = corr
    return out


def accuracy(row: dict[str, Any], acc: dict[int, Correctness]) -> dict[str, float | None]:
    """The worst accuracy over a configuration's measurements (max rel. L2, min cosine and top-1)."""
    checks = [acc[int(r)] for r in row.get("result_ids") or [] if int(r) in acc]

    def worst(key: str, pick) -> float | None:
        vals = [v for v in (_f(c.get(key)) for c in checks) if v is not None]
        return pick(vals) if vals else None

    return {
        "rel_l2": worst("rel_l2", max),
        "cosine": worst("cosine", min),
        "top1": worst("top1_agreement", min),
        "bound": worst("bound_rel_l2", min),
        "n": worst("n_images", min),  # the same seeded inputs in every sweep: one measurement's n
        "weights": ",".join(sorted({str(c.get("weights")) for c in checks if c.get("weights")})),
        "degenerate": next((d for c in checks if (d := degenerate({"correctness": c.to_json()}))), ""),
    }


def accuracy_text(a: dict[str, Any], text: bool = False) -> str:
    """The accuracy evidence in one cell, the agreement with its n and interval (`analysis.accuracy`).

    E.g. ``relL2 1.7e-06 (≤1e-03) · cos 1.0000 · top-1 agreement 0/8 [0%, 37%], synthetic inputs,
    random weights`` (or ``not checked``). ``text``: a text model's row, whose agreement is its output's
    (``output agree``), not an image classifier's top-1.
    """
    from deepgap.analysis.accuracy import agreement

    if a.get("degenerate"):  # the model's output carries no information: nothing was checked
        return f"not checked: {a['degenerate']} (the model's output ignores its input); pass --weights"
    parts = []
    if a.get("rel_l2") is not None:
        parts.append(f"relL2 {a['rel_l2']:.1e}" + (f" (≤{a['bound']:g})" if a.get("bound") else ""))
    if a.get("cosine") is not None:
        parts.append(f"cos {a['cosine']:.4f}")
    ag = agreement(a.get("top1"), a.get("n"), a.get("weights"))
    if ag is not None:  # what the inputs and weights were is said once, in the column's header
        parts.append(
            ag.label()
            .split(" on synthetic")[0]
            .replace("top-1 agreement", "output agree" if text else "top-1 agree")
            + ANSWER_WEIGHTS_MARK.get(ag.weights, "†")
        )
    return " · ".join(parts) or "not checked"


# The answer's accuracy column says once what its top-1 agreement was measured on (`analysis.accuracy`):
# a mark per cell names the weights, the header explains the marks.
ANSWER_WEIGHTS_MARK = {"random": "*", "state-dict": ""}
ANSWER_ACCURACY_HEADER = (
    "accuracy vs FP32 (top-1 agreement on synthetic inputs; * random weights, "
    "† weights not recorded: random unless the run had --weights)"
)
