"""The units of a view: images (img/s, mJ/image, px, top-1) or text (seq/s, tokens/s, J/token, seq len).

Why one module: a text model's rows were right in the answer and wrong everywhere else (`run`, `show`,
`recommend`, Table I, Pareto, energy, configurations, the figures said images/s, mJ/image, ``nchw`` and
top-1 of bert-base). Every view asks here what its rows are: all image models, all text models, or a
mix, and names its columns accordingly. A row is a text model's where it has a sequence length
(``seq_len`` > 0, as `analysis.tokens` reads it). A text row has no memory format (token ids have no
layout) and its size is its sequence length; its agreement with fp32 is the output's, not an image classifier's top-1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from deepgap.core.stats import finite_or_none


def seq_len_of(value: Any) -> int:
    """A stored ``seq_len`` as an integer, 0 where it does not apply (as `analysis.tokens.seq_len_of`)."""
    v = finite_or_none(value)
    return int(v) if v is not None and v > 0 else 0


@dataclass(frozen=True)
class Units:
    """What a view's rows are measured in."""

    kind: str  # "image" | "text" | "mixed"
    rate: str  # "images/s" | "seq/s" | "samples/s"
    short: str  # "img/s" | "seq/s" | "samples/s"
    item: str  # "image" | "sequence" | "sample"
    size: str  # "px" | "seq len" | "px or seq len"
    agreement: str  # "top-1" | "output agreement" | "top-1 or output agreement"

    def header(self, text: str) -> str:
        """An image table's header in these units ("images/s" → "seq/s", "mJ/image" → "mJ/sequence")."""
        if self.kind == "image":
            return text
        out = text.replace("images/s", self.rate).replace("img/s", self.short)
        out = out.replace(" per image", f" per {self.item}").replace("/image", f"/{self.item}")
        article = "an" if self.agreement[0] in "aeiou" else "a"  # "an output agreement"
        # one pass: the mixed wording holds "top-1" itself, and a second replace made "top-1 or output
        # agreement or output agreement"
        out = re.sub(
            r"(\ba )?top-1(?: agreement)?",
            lambda m: (f"{article} " if m.group(1) else "") + self.agreement,
            out,
        )
        return self.size if out == "px" else out


IMAGE = Units("image", "images/s", "img/s", "image", "px", "top-1")
TEXT = Units("text", "seq/s", "seq/s", "sequence", "seq len", "output agreement")
MIXED = Units("mixed", "samples/s", "samples/s", "sample", "px or seq len", "top-1 or output agreement")
# a decoder-only report: its answer rows are decode rows, checked by greedy tokens against fp32
DECODE = Units("decode", "tokens/s", "tokens/s", "token", "in/out tokens", "greedy-token agreement")


def is_text_row(row: dict[str, Any] | pd.Series) -> bool:
    """Whether a row is a text model's (it has a sequence length)."""
    return bool(seq_len_of(row.get("seq_len")))


def of_seq_lens(values: Iterable[Any]) -> Units:
    """The units of rows with these ``seq_len`` values."""
    kinds = {bool(seq_len_of(v)) for v in values}
    return MIXED if kinds == {True, False} else TEXT if kinds == {True} else IMAGE


def of_frame(frame: pd.DataFrame | None) -> Units:
    """The units of a frame's rows (image where it has no ``seq_len`` column or no rows)."""
    if frame is None or not len(frame) or "seq_len" not in frame:
        return IMAGE
    return of_seq_lens(frame["seq_len"])


def size_cell(row: dict[str, Any]) -> Any:
    """A row's size: its sequence length (text), else its resolution in px."""
    seq = seq_len_of(row.get("seq_len"))
    return seq if seq else row.get("resolution")


def format_cell(row: dict[str, Any]) -> Any:
    """A row's memory format: none for a text model (token ids have no layout)."""
    return "–" if is_text_row(row) else row.get("memory_format")


def columns(cols: list[tuple[str, Any]], units: Units) -> list[tuple[str, Any]]:
    """A table's (header, cell) columns in ``units``: headers renamed, size and format cells per row.

    A text or mixed table adds "mJ/token" beside its energy per sample.
    """
    if units.kind == "image":
        return cols
    out: list[tuple[str, Any]] = []
    for head, cell in cols:
        if cell == "resolution":
            cell = size_cell
        elif cell == "memory_format":
            cell = format_cell
        out.append((units.header(head), cell))
        if head == "mJ/image":
            out.append(("mJ/token", _mj_per_token))
    return out


def _mj_per_token(row: dict[str, Any]) -> str:
    """MJ per token, as `formatting.fmt_num` writes a number (3 significant digits)."""
    v = finite_or_none(row.get("joules_per_token"))
    return format(v * 1e3, ".3g") if v is not None else "–"
