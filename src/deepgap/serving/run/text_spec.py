"""``deepgap serve`` for a text model: its flags checked, its build request, its service model and rows.

Why its own module: a text model's requests have lengths (``--seq-len-dist``) and its batches a
padding (``--padding``, `deepgap.serving.sim.seqlen`), which images have not; everything else — the
batcher, the scenarios, the capacity search — is the images' path, fed a `TextService` instead of a
`ServiceModel`. What text serving does not do yet is refused with one line by
`deepgap.serving.run.spec.check_text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from deepgap.serving.records.storage import ServeRecord
from deepgap.serving.run.process import SetupReply
from deepgap.serving.sim.seqlen import (
    Padding,
    SeqLenDist,
    calibration_lengths,
    parse_padding,
    parse_seq_len_dist,
)
from deepgap.serving.sim.simulator import ServiceModel
from deepgap.serving.sim.text_service import TextService

TEXT_ENGINES = ("eager",)


@dataclass(frozen=True)
class TextLoad:
    """A text model's requests: their length distribution and the batches' padding."""

    dist: SeqLenDist
    pad: Padding

    @property
    def masked(self) -> bool:
        """Whether a batch can hold padding (more than one length, or a length below its bucket)."""
        return (
            self.dist.min_len != self.dist.max_len or self.pad.pad_to(self.dist.max_len) != self.dist.max_len
        )

    def setup_fields(self) -> dict[str, Any]:
        """`SetupRequest`'s text fields: the padded lengths to calibrate, the buckets, the mask."""
        lens = calibration_lengths(self.dist, self.pad)
        return {
            "seq_lens": lens,
            "resolution": max(lens),
            "padding_edges": self.pad.edges,
            "masked": self.masked,
            "packed": self.pad.packed,
            "seq_len_dist": self.dist.label(),
        }


def text_load(seq_len_dist: str | None, padding: str, model: str) -> TextLoad | None:
    """``model``'s requests under ``--seq-len-dist`` and ``--padding`` (None: an image model).

    A bad spec is a `UsageError`.
    """
    from deepgap.measure.models import resolve_model

    entry = resolve_model(model)
    if not entry.is_text:
        return None
    dist = parse_seq_len_dist(seq_len_dist, entry.default_resolution, entry.max_seq_len)
    return TextLoad(dist, parse_padding(padding, dist))


def text_service(
    reply: SetupReply, load: TextLoad, seed: int, label: str, depth: int, intervals: bool
) -> TextService:
    """The simulator's service for a text model: each calibrated length's batch curve."""
    curves = {}
    for length, samples in reply.curves_by_len.items():
        bs = sorted(samples)
        parts = reply.parts_by_len.get(length, {})
        iv = tuple(float(parts[b]["interval_s"]) for b in bs) if intervals else None
        curves[length] = ServiceModel(
            tuple(bs),
            tuple(float(np.median(samples[b])) for b in bs),
            {b: np.asarray(samples[b]) for b in bs},
            source=label,
            interval_s=iv,
            depth=depth,
        )
    return TextService(curves, load.dist, load.pad, seed=seed, source=label)


def length_curves(reply: SetupReply, batch_size: int) -> dict[str, dict[str, Any]] | None:
    """Every calibrated length's samples and interval at ``batch_size`` (a curve row's details)."""
    if not reply.curves_by_len:
        return None
    return {
        str(length): {
            "samples_s": list(map(float, s[batch_size])),
            "interval_s": reply.parts_by_len.get(length, {}).get(batch_size, {}).get("interval_s"),
        }
        for length, s in sorted(reply.curves_by_len.items())
        if batch_size in s
    }


def text_lines(rec: ServeRecord, summary: dict[str, Any], lines: list[str]) -> None:
    """A text run's tokens in the console and the summary: its best level that met its bound (or had none).

    Why apart from seq/s: a request is a sequence, but a padded batch runs more tokens than its requests
    hold; useful tokens/s is the work the users asked for, padded tokens/s what the engine ran.
    """
    rows = [lv for lv in rec.levels if lv.details.useful_tokens_per_s]
    ok = [lv for lv in rows if lv.values.get("verdict") in ("pass", "none")] or rows
    if not ok:
        return
    best = max(ok, key=lambda lv: lv.details.useful_tokens_per_s or 0.0)
    d, v = best.details, best.values
    summary.update(
        useful_tokens_per_s=d.useful_tokens_per_s,
        padded_tokens_per_s=d.padded_tokens_per_s,
        padding_fraction=d.padding_fraction,
        tokens_level_seq_per_s=v.get("achieved_qps"),
        seq_len_dist=d.seq_len_dist,
        padding=d.padding,
    )
    lines.append(
        f"text ({d.seq_len_dist}, padding {d.padding}): {v.get('achieved_qps') or 0:,.1f} seq/s, "
        f"{d.useful_tokens_per_s:,.0f} useful tokens/s, {d.padded_tokens_per_s or 0:,.0f} padded tokens/s "
        f"({(d.padding_fraction or 0) * 100:.1f}% padding) at the {v.get('purpose')} level"
        + (f" of {v['target_qps']:,.1f} seq/s offered" if v.get("target_qps") else "")
        + (
            f"; simulator {d.predicted_useful_tokens_per_s:,.0f} useful tokens/s"
            if d.predicted_useful_tokens_per_s
            else ""
        )
    )


def text_tokens_line(summary: Any) -> str:
    """A LoadGen run of a text model as deepgap counted it: seq/s, useful and padded tokens/s, the padding."""
    useful, padded = summary.useful_tokens_per_s or 0.0, summary.padded_tokens_per_s
    return (
        f"text: {summary.achieved_qps or 0:,.1f} seq/s, {useful:,.0f} useful tokens/s, {padded:,.0f} padded "
        f"tokens/s ({(1.0 - useful / padded) * 100:.1f}% padding)"
    )
