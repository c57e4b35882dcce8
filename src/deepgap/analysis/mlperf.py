"""MLPerf Inference's published numbers (ResNet-50, BERT-99) as anchors beside the rows they can stand by.

Why its own table: MLPerf times int8 images already preprocessed and resident in GPU memory (its
preprocessing is untimed), on TensorRT at batch sizes far beyond a default sweep's. deepgap's default rows
time a float batch on the device, so they are not comparable with MLPerf's number; an ``int8-resident``
row (`deepgap.core.records.INPUT_MODES`) is measured under MLPerf's input condition, and only beside such a
row is a ResNet-50 anchor shown. BERT-99's (bert-large, SQuAD v1.1 at up to 384 tokens) is shown beside the
answer's throughput row of bert-large at sequence 384 (`text_anchor_lines`), its difference named: MLPerf
removes the padding (about 54% of the tokens of a batch padded to 384), deepgap's rows are full 384-token
sequences with none to remove. The number never travels without its conditions: `MlperfAnchor.label`
carries the round, scenario, engine, precision, batch, input and power, and every view prints that label
whole.

An anchor is shown only for the GPU it was measured on (the platform's name names it) and the model (and
sequence length) it is of; elsewhere `anchors_for` says why there is none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from deepgap.analysis.frame import is_default_input
from deepgap.analysis.tables import best_rows
from deepgap.core.records import INPUT_MODE_LABELS, input_kind, input_lengths

# BERT-99's input: SQuAD v1.1 at up to 384 tokens, padding removed; 54% of the tokens of a padded batch are
# padding (an abstract on removing BERT's padding, https://openreview.net/forum?id=3nzKUh9a4M)
_SQUAD = "SQuAD v1.1 questions of up to 384 tokens, padding removed: about 54% of the tokens of a batch padded to 384"


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
    inputs: str = "int8 images preprocessed and resident in GPU memory (preprocessing untimed)"
    seq: int | None = None  # a text model's sequence length the anchor stands by (None: an image model)

    def label(self) -> str:
        """The number with every condition it was measured under, in one line."""
        conditions = [
            self.engine,
            *([f"batch {self.batch}"] if self.batch else []),
            self.inputs,
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
        return {"resnet50": "ResNet-50", "bert-large": "BERT-99 (BERT-Large)"}.get(self.model, self.model)


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
    *(
        MlperfAnchor(
            "H200", "bert-large", "v4.1", scenario, value, unit, engine, "", "", inputs=_SQUAD, seq=384
        )
        for scenario, value, unit, engine in (
            ("Offline", 9_164, "samples/s", "TensorRT"),
            ("Server", 7_201, "queries/s", "TensorRT, p99 ≤ 130 ms"),
        )
    ),
)
# the SXM H200 the anchors were measured on; an H200 NVL (PCIe, another power limit) is another GPU
_GPU_RE = {"H200": re.compile(r"\bH200\b(?!.*\bNVL\b)", re.IGNORECASE)}


def anchors_for(platform: str, model: str, seq: int | None = None) -> tuple[list[MlperfAnchor], str]:
    """The anchors of a platform's model (at sequence ``seq``), or none and why (said so)."""
    gpus = [g for g, rx in _GPU_RE.items() if rx.search(str(platform))]
    if not gpus:
        return [], f"no MLPerf anchor for {platform}"
    found = [a for a in ANCHORS if a.gpu in gpus and a.model == str(model) and a.seq == seq]
    if not found:
        return [], f"no MLPerf anchor for {model}{f' at sequence {seq}' if seq else ''} on {platform}"
    return found, ""


def text_anchor_lines(platform: str, model: str, seq: int, per_s: float | None) -> list[str]:
    """Beside a text model's throughput answer: each anchor at its sequence length, and the padding said.

    Nothing where there is no anchor (most text rows): the answer's row is not the place to list absences.
    """
    found, _ = anchors_for(platform, model, seq)
    out = []
    for a in found:
        x = _over(per_s, a) if a.scenario == "Offline" else None
        ratio = f" — this row is {x} of it in sequences/s" if x else ""
        out.append(f"{a.label()}; deepgap's rows are full {seq}-token sequences, none of it padding{ratio}")
    return out


def _over(ours: float | None, a: MlperfAnchor) -> str | None:
    """Our rate over the anchor's ("0.38×"), or None where ours is missing, NaN or not positive."""
    return f"{ours / a.value:.2f}×" if ours and ours == ours and ours > 0 else None


def anchor_lines(platform: str, model: str, ips: float | None = None) -> list[str]:
    """What a view prints beside a resident-input row: each anchor's labelled number (and ours over it)."""
    found, why = anchors_for(platform, model)
    if not found:
        return [why]
    out = []
    for a in found:
        x = _over(ips, a) if a.unit == "img/s" else None
        out.append(a.label() + (f" — this row is {x} of it" if x else ""))
    return out


RESIDENT_NOTE = (
    f"{INPUT_MODE_LABELS['int8-resident']}: the images were quantized and placed on the device before timing, "
    "as MLPerf Inference times them; a deployment still pays that step, so this is never the answer"
)
PACKED_NOTE = (
    "packed: sequences of mixed lengths (--seq-len-dist) with the padding removed, as MLPerf's BERT runs "
    "SQuAD; another workload than full-length sequences, so beside the answer, never it"
)
PADDED_NOTE = (
    "padded: the packed rows' lengths padded to each batch's longest, padded keys masked; tokens/s counts "
    "real tokens only, so packed over padded is what removing the padding gains; never the answer"
)
_NOTES = {"int8-resident": RESIDENT_NOTE, "packed": PACKED_NOTE, "padded": PADDED_NOTE}


def mode_note(mode: Any) -> str:
    """What a row of input mode ``mode`` is (`deepgap.core.records.INPUT_MODES`), and why it is not the answer."""
    kind = input_kind(mode)
    return _NOTES.get(kind, f"{kind}: {INPUT_MODE_LABELS.get(kind, kind)}")


def mode_anchor_lines(platform: str, model: str, row: dict[str, Any]) -> list[str]:
    """MLPerf's numbers beside a row of another input mode: the like-for-like anchor of its kind, if any.

    int8-resident: the ResNet-50 anchors (`anchor_lines`). packed: BERT-99's at the row's sequence length,
    with both sides' lengths named (MLPerf's SQuAD, the row's ``--seq-len-dist``) and the row's sequences/s
    over the Offline number. padded: none (its like-for-like is the packed row beside it).
    """
    kind = input_kind(row.get("input_mode"))
    if kind == "int8-resident":
        return anchor_lines(platform, model, row.get("throughput_ips"))
    seq = int(row.get("seq_len") or 0)
    if kind != "packed" or not seq:
        return []
    found, _ = anchors_for(platform, model, seq)
    mean = row.get("tokens_per_sample")
    lengths = f"{input_lengths(row.get('input_mode'))}" + (
        f", mean {float(mean):.1f} tokens" if mean == mean and mean else ""
    )
    out = []
    for a in found:
        x = _over(row.get("throughput_ips"), a) if a.scenario == "Offline" else None
        ratio = f" — this row is {x} of it in sequences/s" if x else ""
        out.append(f"{a.label()}; padding removed on both sides, this row's lengths {lengths}{ratio}")
    return out


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
