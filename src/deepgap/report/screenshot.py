"""Headless-Chromium screenshots of a report (``deepgap report --screenshot``, the tests, README's image).

Chromium runs with the network blocked and a throw-away profile, so a shot also proves the page
renders offline from the file alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from deepgap.core.errors import UsageError


def find_chromium() -> str | None:
    """A headless-capable Chromium on PATH (Debian's ``chromium`` package), or None."""
    for exe in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(exe):
            return shutil.which(exe)
    return None


def screenshot(
    html_path: str, png_path: str, width: int = 1200, height: int = 900, timeout_s: float = 120
) -> str:
    """Render ``html_path`` in headless Chromium (network blocked) and save a ``width``×``height`` PNG.

    ``html_path`` may end in ``#anchor``: the shot then starts at that part of the page (a figure, say).
    Headless Chromium draws nothing when it scrolls to an anchor, so a copy of the page is shot instead,
    with the page-level elements above the anchor hidden.
    """
    exe = find_chromium()
    if exe is None:
        raise UsageError("a screenshot needs Chromium, which is not installed", "apt-get install chromium")
    out = os.path.abspath(png_path)
    path, _, anchor = html_path.partition("#")
    with tempfile.TemporaryDirectory() as profile:
        tmp_png = os.path.join(profile, "shot.png")
        if anchor:
            with open(path, encoding="utf-8") as fh:
                page = fh.read()
            hide = (
                "<script>(function(){var t=document.getElementById(%s);if(!t)return;"
                "while(t.parentElement&&t.parentElement!==document.body)t=t.parentElement;"
                "for(var n=t.previousElementSibling;n;n=n.previousElementSibling)"
                "{if(n.tagName!=='SCRIPT')n.style.display='none';}})();</script></body>"
            ) % repr(anchor)
            path = os.path.join(profile, "page.html")
            with open(path, "w", encoding="utf-8") as fh:
                head, sep, tail = page.rpartition("</body>")
                fh.write(head + hide + tail if sep else page + hide)
            anchor = ""
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}/p",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=20000",  # the page inflates plotly.js, then draws: wait for it
            f"--window-size={width},{height}",
            f"--screenshot={tmp_png}",
            "file://" + os.path.abspath(path) + (f"#{anchor}" if anchor else ""),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if not os.path.exists(tmp_png):
            raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-800:]}")
        shutil.move(tmp_png, out)
    return out
