"""The report's table of the roofline study's rows: one unit for every time, named in its header.

Why: the table showed the study's columns as stored, ``theoretical_time_s_printed`` (33.33: the study printed
seconds that are milliseconds) beside ``measured_time_s`` (0.759 s) and ``theoretical_time_s_recomputed``
(0.0333 s): ms values under an "s" name, and two units in one table's "_s" columns.
"""

from __future__ import annotations

import pytest

from deepgap.render.formatting import html_table
from deepgap.roofline import figures_paper as rfp
from deepgap.roofline.report_section import TABLE_SPECS
from deepgap.roofline.specs import load_study


def test_every_time_is_in_ms_and_says_so():
    df = rfp.paper_reference_table()
    study = load_study()
    times = [c for c in df.columns if "time" in c]
    assert len(df) == 9 and not [c for c in times if c.endswith("_s")]  # no time left in seconds
    assert times == ["measured_time_ms", "theoretical_time_ms", "theoretical_time_printed_ms"]
    assert list(df["measured_time_ms"]) == pytest.approx(list(study["measured_time_s"] * 1e3))
    # the printed number is eq. 6 in ms (the paper's "s" is its error): one unit, the same values
    assert list(df["theoretical_time_printed_ms"]) == pytest.approx(list(df["theoretical_time_ms"]), rel=0.01)
    r = df[(df["model"] == "ResNet50") & (df["gpu"] == "NVIDIA T4")].iloc[0]
    assert r["theoretical_time_ms"] == pytest.approx(270e9 / 8.1e12 * 1e3)  # 33.3 ms
    assert r["measured_time_ms"] == pytest.approx(759.0)


def test_the_report_headers_name_the_unit():
    table = html_table(
        "roofline_paper_reference", rfp.paper_reference_table(), TABLE_SPECS["roofline_paper_reference"]
    )
    heads = table["headers"]
    assert not [h for h in heads if h.endswith("_s") or h.endswith(" s")]
    timed = [h for h in heads if "measured" in h or "theoretical" in h]
    assert timed == [
        "measured ms",
        "theoretical ms (FLOPs / peak)",
        "theoretical ms as printed (printed as s)",
    ]
    row = table["rows"][0]["cells"]
    t4 = dict(zip(heads, row, strict=True))
    assert (t4["GPU"], t4["measured ms"], t4["theoretical ms (FLOPs / peak)"]) == (
        "NVIDIA T4",
        "759",
        "33.33",
    )
    assert t4["theoretical ms as printed (printed as s)"] == "33.33"
