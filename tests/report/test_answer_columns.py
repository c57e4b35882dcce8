"""The answer table keeps every column readable when a goal is a sentence (a mixed-length text input's).

Before, a store with packed and padded bert-base rows gave the answer rows whose goal reads "lengths
uniform:8:128, padding removed, sequences packed end to end, MLPerf-like" on one unbroken line: the browser
took 576 of the table's 1,577 px at a 1280 px window and pushed the evidence column out of sight (in a
1200 px screenshot of a larger store, the accuracy column was squeezed to a word a line). One headless
Chromium launch measures the header cells at 1280 px.
"""

from __future__ import annotations

import json
import re

from fixtures_store import make_result
from test_report_layout import _chromium_dom, needs_chromium

from deepgap.core.records import ConfigSpec
from deepgap.report.page import build, save
from deepgap.store import Store

WIDTHS = (
    "var w=[].map.call(document.querySelectorAll('#answer-table tr:first-child th'),"
    "function(t){var r=t.getBoundingClientRect();return [Math.round(r.width),Math.round(r.height)];});"
    "var t=document.getElementById('answer-table').getBoundingClientRect();"
    "var p=document.createElement('pre');p.id='widths';"
    "p.textContent=JSON.stringify({cells:w,right:t.right,vw:window.innerWidth});"
    "document.body.appendChild(p);"
)


def _store(path: str) -> str:
    s = Store(path)
    run = s.begin_run(
        {"device": "cuda"}, "deepgap run (fixture)", {"device_name": "Fixture GPU A", "device": "cuda"}, "0"
    )
    for mode, ms in ((None, 10e-3), ("packed:uniform:8:128", 6e-3), ("padded:uniform:8:128", 8e-3)):
        for bs in (1, 64):
            spec = ConfigSpec(model="bert-base", engine="eager", precision="fp16", batch_size=bs, device="cuda",
                              resolution=128, seq_len=128, input_mode=mode)  # fmt: skip
            s.record(run, make_result(spec, ms * (bs / 64 if bs > 1 else 0.1)))
    s.finish_run(run)
    s.close()
    return path


@needs_chromium
def test_no_answer_column_is_squeezed_by_a_long_goal(tmp_path):
    html = tmp_path / "r.html"
    save(build(_store(str(tmp_path / "s.sqlite")), interactive=False), str(html))
    assert "padding removed, sequences packed end to end" in html.read_text(encoding="utf-8")
    dom = _chromium_dom(html, WIDTHS, tmp_path / "top.png", plots=False)
    m = json.loads(re.search(r'<pre id="widths">(.*?)</pre>', dom).group(1))
    cells = m["cells"]
    assert len(cells) == 7, m
    # the whole row on the first screen: the goal took 576 px on one line and the table ran 300 px past
    # the window's right edge (its box scrolls sideways), the evidence column out of sight
    assert m["right"] <= m["vw"], m
    assert min(w for w, _ in cells) >= 60, m  # and no column squeezed to a word a line for it
