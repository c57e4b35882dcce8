"""The two-GPU report answers first and travels: ratio rows on the first screen, no dead link, ≤ 3 MB.

Built once (module fixture; the core and two-GPU sections) from ``fixtures/two_gpus_small.sqlite.xz``:
a cut of the committed two-GPU store ``results/two-gpus/all.sqlite`` (H200 and H100; resnet18 and
resnet50; eager fp16/fp32, cudagraph fp16, quant int8; every 10th telemetry sample; no roofline
profiles), made with sqlite3 DELETEs on a copy.
Screenshots need Chromium (Debian: ``apt-get install chromium``); the page checks run without it.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.analysis import platforms
from deepgap.render import sections
from deepgap.render.style import MAX_SERIES
from deepgap.report import interactive as fi
from deepgap.report.page import build, find_chromium, save
from deepgap.roofline import predict

FIXTURE = packed(FIXTURES / "two_gpus_small.sqlite")
MAX_BYTES = 3 * 1024 * 1024
chromium = pytest.mark.skipif(find_chromium() is None, reason="needs Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("two_gpus")
    store = unpack(FIXTURE, d / "two.sqlite")
    # the core and two-GPU sections only: the roofline's FLOP count builds torchvision models (slow), and
    # its page parts are held to the same no-dead-link rule by tests/report/test_report.py
    with pytest.MonkeyPatch.context() as mp:
        everything = sections.registered
        mp.setattr(
            sections, "registered", lambda: [s for s in everything() if s.name in ("core", "platforms")]
        )
        # fewer bootstrap resamples in the A/B tables: their CIs' width is not under test here
        mp.setattr(platforms, "side_by_side", functools.partial(platforms.side_by_side, n_resamples=200))
        # the per-op roofline's counts, made up: counting ResNet-18's and -50's ops on the meta device took
        # ~4 CPU-s (tests/roofline/test_roofline_flops.py checks the counter, tests/analysis/test_two_gpus.py
        # the prediction)
        mp.setattr(predict, "eager_op_costs", _fake_op_costs)
        rep = build(str(store))
    html = d / "report.html"
    save(rep, str(html))
    return {"rep": rep, "html": html, "text": html.read_text(encoding="utf-8"), "dir": d}


def _fake_op_costs(model: str, resolution: int):
    """Two ops per image (1 GFLOP over 1e6 elements, then 1e7 elements and no FLOPs), as `predict.eager_op_costs`."""
    return [1e9, 0.0], [2e9, 0.0], [1e6, 1e7], [2e6, 2e7]


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for k in ("href", "src"):
            if a.get(k) is not None:
                self.refs.append((tag, k, a[k]))


def dead_links(text: str) -> list[str]:
    """Every href/src that resolves neither inside the page (an #id, a data: URI) nor to an http(s) URL."""
    p = _Links()
    p.feed(text)
    dead = []
    for tag, k, v in p.refs:
        if v.startswith("#") and v[1:] in p.ids:
            continue
        if v.startswith("data:") or re.match(r"https?://", v):
            continue
        dead.append(f"<{tag} {k}={v!r}>")
    return dead


def test_page_has_no_dead_link_and_fits_3mb(page):
    text = page["text"]
    assert dead_links(text) == []
    size = len(text.encode("utf-8"))
    assert size <= MAX_BYTES, size
    # plotly.js once, gzipped, not one copy per figure; the figures inline as JSON
    assert text.count('id="plotly-gz"') == 1 and text.count("Plotly.newPlot") == 0
    assert len(re.findall(r'class="plot-spec"', text)) >= 5
    assert not re.search(r"<script[^>]*\bsrc=", text)


def test_dead_link_check_catches_a_files_link():
    assert dead_links('<a href="report_files/answer.csv">CSV</a><a href="#nowhere">x</a><p id="a"></p>') == [
        "<a href='report_files/answer.csv'>",
        "<a href='#nowhere'>",
    ]


def test_ratio_row_per_model_leads_the_answer(page):
    rep, text = page["rep"], page["text"]
    ratios = rep.ratios
    assert set(ratios["model"]) == {"resnet18", "resnet50"}
    assert set(ratios["platform_a"]) == {"NVIDIA H200"}
    assert set(ratios["platform_b"]) == {"NVIDIA H100 80GB HBM3"}
    thr = ratios[ratios["goal"] == "throughput"].set_index("model")
    assert (thr["ci_low"] <= thr["ratio"]).all() and (thr["ratio"] <= thr["ci_high"]).all()
    table = text[text.index('id="answer-table"') : text.index("</table>", text.index('id="answer-table"'))]
    rows = re.findall(r'<tr class="([^"]*)" data-model="([^"]+)"', table)
    # model by model, each model's ratio row first
    assert [m for c, m in rows if c == "ratio"] == ["resnet18", "resnet50"]
    assert rows[0] == ("ratio", "resnet18") and rows.index(("ratio", "resnet50")) > 1
    assert "H200 / H100" in table and "throughput" in table and "×" in table
    assert (page["dir"] / "report_files" / "answer_ratios.csv").exists()


def test_panels_overlay_platforms_and_engines(page):
    specs = {f.name: f.plotly for f in page["rep"].figures if f.plotly}
    fig6 = specs["fig06_throughput_vs_batch"]
    assert len(fig6["panels"]) <= 4  # was 16: one per platform, model and engine family
    for name, spec in specs.items():
        per = fi.series_per_panel(spec)
        assert max(per.values()) <= MAX_SERIES, name
    by_axes: dict[str, set] = {}
    for t in fig6["data"]:
        m = t.get("meta") or {}
        by_axes.setdefault(t["xaxis"], set()).add((m.get("platform"), m.get("engine")))
    assert any(len({p for p, _ in v}) == 2 and len({e for _, e in v}) >= 2 for v in by_axes.values())
    # Fig. 7 is interactive too (it was a PNG with 5-point labels): both GPUs' bars in one panel, a CI each
    fig7 = specs["fig07_median_latency"]
    assert [p["title"] for p in fig7["panels"]] == ["GPU"] and fig7["layout"]["barmode"] == "group"
    assert {t["meta"]["platform"] for t in fig7["data"]} == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert all(
        t["type"] == "bar" and "error_y" in t and "95% CI" in t["customdata"][0][1] for t in fig7["data"]
    )


def test_hovers_carry_their_own_ci_and_latency_has_a_p99_band(page):
    specs = {f.name: f.plotly for f in page["rep"].figures if f.plotly}
    lat = specs["fig08_latency_vs_batch"]
    bands = [t for t in lat["data"] if t.get("fill") == "toself"]
    assert bands and all(t["name"] == "tail band" for t in bands)
    line = next(t for t in lat["data"] if t.get("mode") == "lines+markers")
    assert all("median latency ms 95% CI" in c[1] for c in line["customdata"])
    for name in ("fig_perf_per_watt", "fig_joules_per_image"):
        if name in specs:
            for t in specs[name]["data"]:
                for c in t.get("customdata") or []:
                    assert "throughput" not in c[1], (name, c)
    # log axes read 1-2-5 in plain numbers, never plotly's bare "5 2"
    for k, ax in lat["layout"].items():
        if k.startswith("yaxis"):
            assert ax["type"] == "log" and ax["ticktext"] and all(float(t) > 0 for t in ax["ticktext"])


def test_static_page_says_so(page, tmp_path):
    rep = page["rep"]
    rep.interactive = False
    try:
        out = tmp_path / "s.html"
        save(rep, str(out))
    finally:
        rep.interactive = True
    text = out.read_text(encoding="utf-8")
    assert "Static page" in text and "<script" not in text and dead_links(text) == []


def test_missing_plotly_fails_at_start(tmp_path, monkeypatch):
    from deepgap.cli import main

    monkeypatch.setattr(fi, "available", lambda: False)
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "any.sqlite"), "-o", str(out)]) == 2
    assert not out.exists()


HEADLESS_MIN_WIDTH = 500  # headless Chromium's narrowest window: a phone's 390 px is an iframe inside it
WIDTHS = (1280, 390)  # a laptop's screen and a phone's
VIEWPORT_H = 757  # the page's height in a 900-px-high headless window (Chromium keeps the rest)


def _measure(html: Path, widths: tuple[int, ...] = WIDTHS) -> dict[int, dict]:
    """Boxes of the answer table, its ratio rows and numbers, the plots' legends and toolbars (headless Chromium).

    One launch for every width (each launch costs ~6 CPU-s: the browser, and plotly drawing every plot):
    the page is measured inside an iframe of ``width`` × `VIEWPORT_H` px per width, side by side in one
    window, and posts its boxes to the frame around it (a window alone is at least `HEADLESS_MIN_WIDTH` px
    wide, whatever was asked; until 2026-12-03 the 1280-px page had a window of its own).
    """
    js = (
        "function box(e){var b=e.getBoundingClientRect();return [b.left,b.right,b.top,b.bottom];}"
        "function go(){var t=document.getElementById('answer-table').getBoundingClientRect();"
        "var r=[].map.call(document.querySelectorAll('#answer-table tr.ratio'),function(e){"
        "var b=e.getBoundingClientRect();return [b.top,b.bottom];});"
        "var titles=[].map.call(document.querySelectorAll('div.plot .annotation-text'),function(e){"
        "var b=e.getBoundingClientRect();return [b.left,b.right,b.top,b.bottom];});"
        "var s=JSON.stringify({table:[t.top,t.bottom,t.right],ratios:r,vw:window.innerWidth,"
        "vh:window.innerHeight,scroll:document.documentElement.scrollWidth,"
        "plots:document.documentElement.getAttribute('data-plots'),titles:titles,"
        "values:[].map.call(document.querySelectorAll('#answer-table td.value'),box),"
        "bars:[].map.call(document.querySelectorAll('div.plot'),function(p){var l=p.querySelector('g.legend'),"
        "m=p.querySelector('.modebar');return l&&m?[box(l),box(m)]:null;}).filter(Boolean),"
        "ab:['platforms_best_batch','platforms_matched'].map(function(id){var b=document.getElementById(id)"
        ".nextElementSibling;return [b.scrollWidth,b.clientWidth];}),"
        "drawn:document.querySelectorAll('div.plot .main-svg').length});"
        "window.parent.postMessage(s,'*');}"
        "(function w(n){if(document.documentElement.getAttribute('data-plots')||n>200)go();"
        "else setTimeout(function(){w(n+1);},50);})(0);"
    )
    frames = "".join(
        f'<iframe id="w{w}" src="page.html" style="border:0;width:{w}px;height:{VIEWPORT_H}px;'
        'vertical-align:top"></iframe>'
        for w in widths
    )
    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / "page.html"  # the page alone, copied away from its _files folder
        text = html.read_text(encoding="utf-8")
        head, _, tail = text.rpartition("</body>")
        copy.write_text(head + f"<script>{js}</script></body>" + tail, encoding="utf-8")
        frame = Path(d) / "frames.html"
        frame.write_text(
            f'<html><body style="margin:0;white-space:nowrap">{frames}<script>'
            'window.addEventListener("message",function(e){var f=[].filter.call('
            'document.querySelectorAll("iframe"),function(f){return f.contentWindow===e.source;})[0];'
            'var p=document.createElement("pre");p.id="measured-"+f.id;p.textContent=e.data;'
            "document.body.appendChild(p);});</script></body></html>",
            encoding="utf-8",
        )
        cmd = [
            find_chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={d}/profile",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=20000",
            f"--window-size={max(sum(widths), HEADLESS_MIN_WIDTH)},900",
            "--dump-dom",
            frame.as_uri(),
        ]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    found = dict(re.findall(r'<pre id="measured-w(\d+)">(.*?)</pre>', dom))
    return {w: json.loads(found[str(w)]) for w in widths if str(w) in found}


@pytest.fixture(scope="module")
def measured(page) -> dict[int, dict]:
    """`_measure` of the page at every width of `WIDTHS`, once for the module."""
    return _measure(page["html"])


def _overlap(a, b) -> bool:
    return a[0] < b[1] - 1 and b[0] < a[1] - 1 and a[2] < b[3] - 1 and b[2] < a[3] - 1


@chromium
@pytest.mark.parametrize("width", WIDTHS)
def test_answer_with_ratio_on_first_screen(measured, width):
    m = measured[width]
    assert m["plots"] == "drawn" and m["drawn"] >= 5  # plotly.js inflated and drew every figure, offline
    assert len(m["ratios"]) == 2 and all(top > 0 and bottom <= m["vh"] for top, bottom in m["ratios"]), m
    if width == 1280:  # the whole answer, H100 rows included, without scrolling; the A/B tables fit
        assert 0 < m["table"][0] < m["table"][1] <= m["vh"] and m["table"][2] <= m["vw"], m
        assert all(scroll <= box for scroll, box in m["ab"]), m["ab"]
    assert m["scroll"] <= m["vw"]  # nothing runs past the right edge
    assert m["vw"] == width  # a phone's width, not headless Chromium's narrowest window
    # the answer's numbers are on screen without scrolling sideways (they came after the configuration)
    values = m["values"]
    assert values and all(left >= 0 and right <= m["vw"] for left, right, _, _ in values), values
    # no legend runs under plotly's toolbar (the modebar, top right of each plot)
    assert m["bars"] and not any(_overlap(legend, bar) for legend, bar in m["bars"]), m["bars"]
    titles = m["titles"]
    assert titles and not any(_overlap(a, b) for i, a in enumerate(titles) for b in titles[i + 1 :]), titles
