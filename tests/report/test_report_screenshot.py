"""`deepgap report --screenshot`: the CLI builds the page and hands it, at ``--size``, to headless Chromium.

The CLI's side runs here against a stand-in browser that records its command line and writes a PNG: a real
Chromium launch costs ~6 CPU-s on the 2-core CI machine, and what Chromium itself makes of
`deepgap.report.screenshot.screenshot`'s command (a PNG of the asked size, the page drawn, an anchor's
section) is checked with the real browser in tests/report/test_report_layout.py, on the report it builds anyway.
"""

import json
import sys

from fixtures_store import build_store

import deepgap.report.page
import deepgap.report.screenshot
from deepgap.cli import main

# a stand-in for Chromium: records its arguments, writes a 1x1 PNG where --screenshot= says
FAKE_CHROMIUM = """#!{python}
import json, sys
args = sys.argv[1:]
shot = next(a.split("=", 1)[1] for a in args if a.startswith("--screenshot="))
with open(shot, "wb") as fh:
    fh.write(bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
    ))
with open({log!r}, "w") as fh:
    json.dump(args, fh)
"""


def test_cli_screenshot_flag(tmp_path, capsys, monkeypatch):
    log = tmp_path / "chromium-args.json"
    fake = tmp_path / "chromium"
    fake.write_text(FAKE_CHROMIUM.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    for module in (deepgap.report.page, deepgap.report.screenshot):  # the command's check, then the shot
        monkeypatch.setattr(module, "find_chromium", lambda: str(fake))
    store = str(tmp_path / "fx.sqlite")
    build_store(store, gpu=False)
    shot, page = tmp_path / "s.png", tmp_path / "r.html"
    assert main(["report", store, "-o", str(page), "--screenshot", str(shot), "--size", "800x600"]) == 0
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"screenshot {shot}" in capsys.readouterr().out
    args = json.loads(log.read_text())
    assert "--headless" in args and "--window-size=800,600" in args
    assert args[-1] == page.resolve().as_uri()  # the page the command wrote, offline
    assert "--host-resolver-rules=MAP * ~NOTFOUND" in args
