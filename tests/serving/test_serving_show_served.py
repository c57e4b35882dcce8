"""Serving level tables: a served rate above the offered one, beyond the Poisson noise of n, is marked.

Why: a level's served rate is n ÷ (first arrival → last result), so a short capacity probe whose last
results come back inside its window can show "served q/s" above "offered q/s". Within the noise of its n
arrivals that is true and the tables say why (their titles); beyond it, the cell carries a mark in
``deepgap show`` and in the report, never a plain number.
"""

from __future__ import annotations

import math

import pytest
from committed_slices import unpacked

from deepgap.serving.show import console, report_section, tables
from deepgap.serving.show.llm_tables import COLUMNS as LLM
from deepgap.store import reading


def _level(offered: float, served: float, n: int) -> dict:
    return {"status": "ok", "target_qps": offered, "offered_qps": offered, "achieved_qps": served, "n": n}


@pytest.mark.parametrize(
    ("served", "n", "marked"),
    [
        (101.0, 400, False),  # 1% over at n = 400: well inside 3/√399 (15%)
        (114.0, 400, False),  # 14% over: still inside
        (120.0, 400, True),  # 20% over: no Poisson noise of 400 arrivals
        (103.0, 40_000, True),  # 3% over at n = 40,000: beyond 3/√n (1.5%)
        (150.0, 1, False),  # one request: no rate to judge
    ],
)
def test_served_above_offered_beyond_the_noise_of_n(served, n, marked):
    assert tables.served_above_offered(served, 100.0, n) is marked
    limit = 100.0 * n / (n - 1) * (1 + 3 / math.sqrt(n - 1)) if n > 1 else math.inf
    assert marked == (served > limit)


def test_missing_numbers_are_never_marked():
    for args in [(None, 100.0, 400), (120.0, None, 400), (120.0, 0.0, 400), (120.0, 100.0, None)]:
        assert not tables.served_above_offered(*args)
    assert not tables.served_above_offered(float("nan"), 100.0, 400)


def _cells(columns, row: dict, header: str) -> str:
    return dict(columns)[header](row)


def test_show_and_report_mark_the_cell_and_say_why():
    high, fine = _level(100.0, 120.0, 400), _level(100.0, 101.0, 400)
    for cols, fmt in ((console.LEVELS, "120.0"), (console.INTERFERENCE, "120.0"), (LLM, "120.0")):
        assert _cells(cols, high, "served q/s") == fmt + tables.SERVED_MARK
        assert _cells(cols, fine, "served q/s") == "101.0"
    assert _cells(console.TEXT, high, "served seq/s") == "120.0" + tables.SERVED_MARK
    specs = report_section.TABLE_SPECS
    for name, header in (
        ("serving_levels", "served q/s"),
        ("serving_text", "served seq/s"),
        ("serving_interference", "served q/s"),
        ("serving_llm", "served q/s"),
    ):
        title, cols = specs[name]
        assert tables.SERVED_NOTE in title, name
        assert _cells(cols, high, header).endswith(tables.SERVED_MARK), name
        assert not _cells(cols, fine, header).endswith(tables.SERVED_MARK), name


def test_levels_frame_carries_the_mark(tmp_path):
    """A committed serve store's levels: a probe served 0.5% above offered at n = 22,010 is noise, unmarked."""
    with reading(str(unpacked("h100_serving", tmp_path))) as st:
        lv = tables.levels(st, None)
    assert "served_above_offered" in lv
    over = lv[lv["achieved_qps"] > lv["target_qps"]]
    assert len(over) and not over["served_above_offered"].any()
    bumped = over.iloc[[0]].assign(achieved_qps=over["target_qps"].iloc[0] * 2, n=1000)
    assert tables.served_cell(bumped.to_dict("records")[0], str).endswith(tables.SERVED_MARK)


def test_show_says_what_served_is_where_a_level_was_offered_a_rate(tmp_path):
    from rich.console import Console

    out = Console(record=True, width=400)
    with reading(str(unpacked("h100_serving", tmp_path))) as st:
        console.print_serving(st, out, None)
    text = " ".join(out.export_text().split())
    assert "served = n ÷ (first arrival → last result)" in text  # its probes were offered rates
    assert tables.SERVED_MARK.strip() not in text.replace(
        f"'{tables.SERVED_MARK.strip()}'", ""
    )  # none marked
