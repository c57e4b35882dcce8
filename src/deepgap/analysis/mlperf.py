"""MLPerf Inference's published ResNet-50 numbers, as an anchor beside deepgap's resident-input rows.

Why its own table: MLPerf times int8 images already preprocessed and resident in GPU memory (its
preprocessing is untimed), on TensorRT at batch sizes far beyond a default sweep's. deepgap's default rows
time a float batch on the device, so they are not comparable with MLPerf's number; an ``int8-resident``
row (`deepgap.core.records.INPUT_MODES`) is measured under MLPerf's input condition, and only beside such a
row is the anchor shown. The number never travels without its conditions: `MlperfAnchor.label` carries the
round, scenario, engine, precision, batch, input and power, and every view prints that label whole.

An anchor is shown only for the GPU it was measured on (the platform's name names it) and the model it
is of; elsewhere `anchor_for` says why there is none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from deepgap.analysis.frame import is_default_input
from deepgap.analysis.tables import best_rows
from deepgap.core.records import INPUT_MODE_LABELS


@dataclass(frozen=True)
class MlperfAnchor:
    """One published MLPerf Inference result, per GPU, with the conditions it was measured under."""

    gpu: str  # the GPU it was measured on, as a platform name names it
    model: str  # deepgap's model name
    round: str
    scenario: str  # "Offline" (images/s) or "Server" (queries/s under a latency bound)
    value: float
    unit: str
    engine: str
    batch: str  # the batch the submission ran, as published ("2048"), or "" where not stated
    power: str  # "" (no cap: the Performance division) or the MaxQ cap
    energy: str = ""  # energy per image where published (MaxQ)
    shown: str = ""  # the value as published where rounded there ("69.5k"); else the exact value

    def label(self) -> str:
        """The number with every condition it was measured under, in one line."""
        conditions = [
            self.engine,
            *([f"batch {self.batch}"] if self.batch else []),
            "int8 images preprocessed and resident in GPU memory (preprocessing untimed)",
            self.power or "no power cap",
            *([self.energy] if self.energy else []),
        ]
        return (
            f"MLPerf Inference {self.round} {self.model_name} {self.scenario} per {self.gpu}: "
            f"{self.shown or f'{self.value:,.0f}'} {self.unit} ({'; '.join(conditions)})"
        )

    @property
    def model_name(self) -> str:
        """MLPerf's name of the model."""
        return {"resnet50": "ResNet-50"}.get(self.model, self.model)


ANCHORS: tuple[MlperfAnchor, ...] = (
    MlperfAnchor("H200", "resnet50", "v5.0", "Offline", 95_089, "img/s", "TensorRT INT8", "2048", ""),
    MlperfAnchor("H200", "resnet50", "v5.0", "Server", 79_024, "queries/s", "TensorRT INT8", "", ""),
    MlperfAnchor(
        "H200",
        "resnet50",
        "v5.0",
        "Offline MaxQ",
        69_500,
        "img/s",
        "TensorRT INT8",
        "",
        "MaxQ: 350 W power cap",
        "~5 mJ/img",
        "69.5k",
    ),
)
# the SXM H200 the anchors were measured on; an H200 NVL (PCIe, another power limit) is another GPU
_GPU_RE = {"H200": re.compile(r"\bH200\b(?!.*\bNVL\b)", re.IGNORECASE)}


def anchors_for(platform: str, model: str) -> tuple[list[MlperfAnchor], str]:
    """The anchors of a platform's model, or none and why (another GPU or model: no anchor, said so)."""
    gpus = [g for g, rx in _GPU_RE.items() if rx.search(str(platform))]
    if not gpus:
        return [], f"no MLPerf anchor for {platform}"
    found = [a for a in ANCHORS if a.gpu in gpus and a.model == str(model)]
    if not found:
        return [], f"no MLPerf anchor for {model} on {platform}"
    return found, ""


def anchor_lines(platform: str, model: str, ips: float | None = None) -> list[str]:
    """What a view prints beside a resident-input row: each anchor's labelled number (and ours over it)."""
    found, why = anchors_for(platform, model)
    if not found:
        return [why]
    out = []
    for a in found:
        ratio = (
            f" — this row is {ips / a.value:.2f}× of it"
            if ips and ips == ips and a.unit == "img/s" and ips > 0
            else ""
        )
        out.append(a.label() + ratio)
    return out


RESIDENT_NOTE = (
    f"{INPUT_MODE_LABELS['int8-resident']}: the images were quantized and placed on the device before timing, "
    "as MLPerf Inference times them; a deployment still pays that step, so this is never the answer"
)


def resident_best(agg: pd.DataFrame) -> list[dict[str, Any]]:
    """Per input mode other than the default, the highest-throughput configuration of ``agg`` (one model).

    What the answer shows beside itself: unflagged where there is one (`tables.best_rows`' rule).
    """
    if agg.empty or "input_mode" not in agg:
        return []
    resident = agg[~is_default_input(agg)]
    if resident.empty:
        return []
    return best_rows(resident, ["input_mode"]).to_dict("records")
