"""The report opens in headless Chromium (network blocked) and renders: a 1200×900 screenshot, not blank."""

from pathlib import Path

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.report.page import find_chromium, screenshot, write_report

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="needs Chromium for the headless screenshot (Debian: apt-get install chromium)",
)


def test_headless_chromium_screenshot(tmp_path):
    import numpy as np
    from matplotlib.image import imread

    store = str(tmp_path / "fx.sqlite")
    build_store(store)
    html = str(tmp_path / "report.html")
    write_report(store, html)
    png = screenshot(html, str(tmp_path / "shot.png"), 1200, 900)
    img = imread(png)
    assert img.shape[:2] == (900, 1200)
    rgb = img[..., :3]
    assert rgb.std() > 0.05  # text, tables and colour, not an empty or error page
    # the header's blue rule (#1f77b4) is drawn: the page's own CSS was applied
    blue = (np.abs(rgb - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=-1) < 0.05).sum()
    assert blue > 1000


def test_cli_screenshot_flag(tmp_path, capsys):
    store = str(tmp_path / "fx.sqlite")
    build_store(store, gpu=False)
    shot = tmp_path / "s.png"
    assert (
        main(
            ["report", store, "-o", str(tmp_path / "r.html"), "--screenshot", str(shot), "--size", "800x600"]
        )
        == 0
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "screenshot" in capsys.readouterr().out


def _chromium_dom(html: Path, script: str, width: int = 1280, height: int = 900) -> str:
    """The page's DOM after ``script`` ran in headless Chromium at ``width``×``height`` (network blocked)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "page.html"
        text = html.read_text(encoding="utf-8")
        head, _, tail = text.rpartition("</body>")
        # run the script once the page has inflated plotly.js and drawn its plots (or said why not)
        wait = (
            "(function w(n){if(document.documentElement.getAttribute('data-plots')||n>200){%s}"
            "else setTimeout(function(){w(n+1);},50);})(0);" % script
        )
        page.write_text(head + f"<script>{wait}</script></body>" + tail, encoding="utf-8")
        cmd = [
            find_chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={d}/profile",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=20000",
            f"--window-size={width},{height}",
            "--dump-dom",
            page.as_uri(),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


@pytest.fixture(scope="module")
def multi_report(tmp_path_factory):
    from fixtures_multi import build_multi_store

    d = tmp_path_factory.mktemp("shots")
    store = str(d / "multi.sqlite")
    build_multi_store(store)
    html = d / "report.html"
    write_report(store, str(html))
    return html


def test_answer_table_visible_without_scrolling(multi_report, tmp_path):
    """At 1280×900 the whole answer table is on the first screen, and the screenshot shows it."""
    import json
    import re

    import numpy as np
    from matplotlib.image import imread

    measure = (
        "var r=document.getElementById('answer-table').getBoundingClientRect();"
        "var p=document.createElement('pre');p.id='measured';"
        "p.textContent=JSON.stringify({top:r.top,bottom:r.bottom,right:r.right,vw:window.innerWidth,"
        "vh:window.innerHeight,scroll:document.documentElement.scrollWidth});document.body.appendChild(p);"
    )
    dom = _chromium_dom(multi_report, measure)
    m = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom).group(1))
    # headless Chromium keeps some of the window for its own frame (the viewport is ~760 px of the 900)
    assert m["vw"] == 1280 and m["vh"] >= 700
    assert 0 < m["top"] < m["bottom"] <= m["vh"] and m["right"] <= m["vw"], m
    assert m["scroll"] <= m["vw"]  # nothing runs past the right edge: wide tables scroll in their box
    img = imread(screenshot(str(multi_report), str(tmp_path / "top.png"), 1280, 900))[..., :3]
    head = (np.abs(img - np.array([0xE6, 0xF2, 0xE6]) / 255).max(axis=-1) < 0.02).sum()
    assert head > 5000  # the answer table's green header row is drawn on the first screen


def test_figure_section_screenshot(multi_report, tmp_path):
    """A figure section renders (plotly drew every plot) and none of its panels holds more than 8 series."""
    import json
    import re

    from matplotlib.image import imread

    from deepgap.render.style import MAX_SERIES
    from deepgap.report import interactive as fi

    text = multi_report.read_text(encoding="utf-8")
    specs = re.findall(r'class="plot-spec" data-target="plot-[^"]+">(.*?)</script>', text, re.S)
    assert len(specs) >= 5
    for body in specs:
        assert max(fi.series_per_panel(json.loads(body.replace("<\\/", "</"))).values()) <= MAX_SERIES
    count = (
        "var p=document.createElement('pre');p.id='drawn';"
        "p.textContent=document.querySelectorAll('div.plot .main-svg').length;document.body.appendChild(p);"
    )
    drawn = int(re.search(r'<pre id="drawn">(\d+)</pre>', _chromium_dom(multi_report, count)).group(1))
    assert drawn >= len(specs)
    shot = screenshot(str(multi_report) + "#fig06_throughput_vs_batch", str(tmp_path / "fig.png"), 1280, 900)
    img = imread(shot)[..., :3]
    assert img.shape[:2] == (900, 1280) and img.std() > 0.05


def test_filters_hide_rows_and_traces(multi_report):
    """Choosing a model, then a batch, in the page's filter menus narrows every plot and table."""
    import json
    import re

    js = (
        "function n(){var d=document.getElementById('plot-fig06_throughput_vs_batch');"
        "return d.querySelectorAll('.scatterlayer .trace').length+','+Array.prototype.filter.call("
        "document.querySelectorAll('tr[data-model]'),function(t){return t.style.display!=='none';}).length;}"
        "function pick(k,v){var s=document.querySelector('#filters select[name='+k+']');s.value=v;"
        "s.dispatchEvent(new Event('change'));}"
        "var out=n();pick('model','resnet50');out+=' '+n();"
        "var titles=[].map.call("
        "document.querySelectorAll('#plot-fig06_throughput_vs_batch .annotation-text'),"
        "function(e){return e.textContent;});pick('batch','8');out+=' '+n();"
        "var p=document.createElement('pre');p.id='res';p.textContent=out;document.body.appendChild(p);"
        "var q=document.createElement('pre');q.id='titles';q.textContent=JSON.stringify(titles);"
        "document.body.appendChild(q);"
    )
    dom = _chromium_dom(multi_report, js)
    res = re.search(r'<pre id="res">(.*?)</pre>', dom).group(1)
    titles = json.loads(re.search(r'<pre id="titles">(.*?)</pre>', dom).group(1))
    # no empty panel is left behind: every panel still shown is one of the chosen model's
    assert titles and all(t.startswith("resnet50") for t in titles), titles
    (t0, r0), (t1, r1), (t2, r2) = (tuple(map(int, s.split(","))) for s in res.split())
    assert t0 > t1 > 0 and r0 > r1 > r2 > 0
    assert t2 <= t1
