"""The report's header counts every workload it shows: a decode- or serve-only store read "0 measurements" (and
"No successful measurement") above its own decode table or serve levels."""

from __future__ import annotations

import re

from fixtures_decode import write_decode_store

from deepgap.report.page import build, save


def _header(html: str) -> str:
    i = html.index('class="meta counts"')
    return " ".join(re.sub(r"<[^>]+>", " ", html[i : i + 1200]).split())


def test_a_decode_only_store_counts_its_decode_configurations(tmp_path):
    store = str(tmp_path / "d.sqlite")
    write_decode_store(store)
    rep = build(store, interactive=False)
    assert rep.counts["measurements"] == 0 and rep.counts["decode"] > 0 and rep.counts["levels"] == 0
    save(rep, str(tmp_path / "r.html"))
    head = _header((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert f"0 batch-sweep measurements {rep.counts['decode']} decode configuration(s)" in head, head
    # its answer's accuracy header spoke of top-1 above cells of greedy tokens (image units: no forward rows)
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "accuracy vs FP32 (greedy-token agreement" in html and "top-1 agreement" not in html
    assert "joules per image" not in html


def test_a_serve_only_store_counts_its_levels_and_says_where_they_are(tmp_path):
    from committed_slices import unpacked

    store = str(unpacked("h100_serving", tmp_path))
    rep = build(store, interactive=False)
    assert rep.counts["measurements"] == 0 and rep.counts["levels"] > 0
    save(rep, str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert f"{rep.counts['levels']} serve level(s)" in _header(html)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert (
        f"No successful batch-sweep measurement in this selection: its {rep.counts['levels']} serve" in text
    )
