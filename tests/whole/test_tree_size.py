"""The tree stays small enough to clone, review and carry to a device machine (64 MiB of working tree).

Why: raw stores and HTML reports once made ``results/`` 142 MB; they left the tree for history
(docs/results.md). Results are committed as CSV exports plus a README, so the tracked files stay under
10 MB, ``results/`` under 6 MB, no SQLite store is tracked there, and
one example HTML report (≤ 3 MB) may stay for README to link.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from repo_paths import ROOT

MB = 1_000_000


def tracked() -> list[Path]:
    """The files git tracks, or every file under the root outside .git when this is no git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(ROOT))
            for p in ROOT.rglob("*")
            if p.is_file() and ".git" not in p.parts and ".venv" not in p.parts
        ]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def test_tracked_files_fit_the_budget():
    files = tracked()
    total = sum(p.stat().st_size for p in files)
    results = [p for p in files if p.relative_to(ROOT).parts[0] == "results"]
    in_results = sum(p.stat().st_size for p in results)
    biggest = sorted(files, key=lambda p: p.stat().st_size)[-3:]
    assert total <= 10 * MB, f"tracked files total {total / MB:.1f} MB > 10 MB; biggest: {biggest}"
    assert in_results <= 6 * MB, f"results/ totals {in_results / MB:.1f} MB > 6 MB"


def test_results_hold_no_raw_store_and_one_example_report_page():
    """No store at all; one HTML report, at most 3 MB, may stay as the example README links to."""
    in_results = [p for p in tracked() if p.relative_to(ROOT).parts[0] == "results"]
    stores = [
        p.relative_to(ROOT)
        for p in in_results
        if p.name.endswith((".sqlite", ".sqlite.gz", ".sqlite.xz", ".db"))
        or p.read_bytes()[:16] == b"SQLite format 3\0"
    ]
    assert not stores, f"commit CSV exports plus a README instead (docs/results.md): {stores}"
    pages = [p for p in in_results if p.name.endswith((".html", ".html.gz", ".htm"))]
    assert len(pages) <= 1, f"one example report may stay in results/, not {len(pages)}: {pages}"
    assert all(p.stat().st_size <= 3 * MB for p in pages), f"the example report passes 3 MB: {pages}"
