"""The report opens in headless Chromium (network blocked) and renders: a 1200×900 screenshot, not blank."""

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.report import find_chromium, screenshot, write_report

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
