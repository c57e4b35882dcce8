"""ruff's lint and format checks over the whole repository, in the suite CI runs.

Why a test and not a separate CI step: `.ci/run` runs exactly the README's test command, so anything CI
checks is a test. The rules and their reasons are pyproject.toml's ``[tool.ruff]``; the version is pinned
to a minor in the test extra, since new rules arrive with minors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from repo_paths import ROOT


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert exe, "ruff not found: install the test extra (pip install -e '.[test]')"
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_finds_nothing():
    r = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_changes_nothing():
    r = _ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
