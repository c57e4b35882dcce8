"""`deepgap report --screenshot`: the CLI writes a PNG of the page through headless Chromium.

The screenshots of the page itself (not blank, answer table on the first screen, plots drawn, filters) are
in tests/test_report_layout.py, on the report it builds anyway.
"""

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.report.page import find_chromium

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="needs Chromium for the headless screenshot (Debian: apt-get install chromium)",
)


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
