"""A report of a decoder-only store says where its rows are, and its answer's accuracy cells name their numbers.

Before: figures 6-11 read "unavailable: no successful measurement" beside a decode table of successful rows,
and the answer's decode cells ("100% of 381; relL2 …") sat under a header speaking of top-1 agreement.
"""

from __future__ import annotations

import pytest
from fixtures_decode import write_decode_store

from deepgap.render.draw import NO_MEASUREMENT
from deepgap.report.core import NO_FORWARD
from deepgap.report.page import build


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dec") / "s.sqlite")
    write_decode_store(path)
    return build(path, interactive=False)


def test_forward_figures_point_to_the_decode_table(rep):
    reasons = {f.name: f.unavailable for f in rep.figures}
    assert reasons["fig06_throughput_vs_batch"] == NO_FORWARD and reasons["fig10_pareto"] == NO_FORWARD
    assert NO_MEASUREMENT not in reasons.values(), reasons
    assert not reasons["fig_decode_roofline"]  # the decode figure itself is drawn


def test_decode_accuracy_cells_name_their_numbers(rep):
    cells = rep.answer_table.loc[rep.answer_table["goal"] == "decode throughput", "accuracy"]
    assert len(cells) and all(c.startswith("greedy tokens equal to fp32's: ") for c in cells), list(cells)
    assert all("; logits relL2 " in c for c in cells)
