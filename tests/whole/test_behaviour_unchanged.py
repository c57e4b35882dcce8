"""The committed stores open, show, recommend, compare, export, merge and report exactly as before.

Why: the modules of ``src/deepgap`` are being moved into packages (run/, report/, render/, core/,
measure/), a refactor that must not change one character a user sees. This file pins what the reading
commands print for stores the project once committed under ``results/`` (kept xz-compressed, under their
old relative paths, in ``tests/fixtures/archive/``: reading them is this test's purpose) against golden outputs
captured from the code before the move, in ``tests/fixtures/golden/``.

It imports only ``deepgap.cli`` (and ``deepgap``), the entry point that survives the move; every other
module path is about to change. Each case runs ``deepgap ...`` in this process through
``deepgap.cli.main``, from a folder holding copies of the stores (relative paths: no temp path reaches
the output, and rich wraps the same way everywhere), with a fixed console width and a fixed redaction
key; the committed files are never opened for writing, and their bytes are compared at the end.

What varies between runs and is normalised away (:func:`normalise`): the one absolute path the CLI
prints (report's ``wrote`` line: ``<WORKDIR>``), ANSI escapes (none without a terminal, stripped in
case), trailing blanks, and the report's generation stamp (only its headings, the names of the files it
writes and its tables' CSV files are compared, never the page or the PNGs). Reports run with
``--no-redact`` (their default key is fresh per command); ``export``/``merge --redact`` run under
``DEEPGAP_REDACT_KEY`` fixed here. Nothing else varies: the bootstrap CIs are seeded, and a case run
alone gives the same text as in the full file (the in-process caches only save time).

Runtime: about 35 s of CPU on two cores beyond pytest's start (about 8 s more), most of it the
bootstrap aggregates, torch building ResNet-50 for the roofline columns (compare, report) and the
report's figures; that is why ``compare`` of the two default sweeps is limited to one model.

A failure prints a unified diff of the first lines that differ. When a change of output is intended,
regenerate the golden files and review their diff in git::

    DEEPGAP_REGEN_GOLDEN=1 PYTHONPATH=src python -m pytest -q tests/whole/test_behaviour_unchanged.py
    git diff --stat tests/fixtures/golden/

A golden file over ~8 KB of text is stored xz-compressed (``.txt.xz``; xz's output carries no timestamp, so
regenerating an unchanged output leaves its bytes unchanged; it took 0.8× gzip's bytes, which the tree's 10 MB
budget needed).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import lzma
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.cli import main

ARCHIVE = FIXTURES / "archive"  # each store as <rel>.xz
GOLDEN = FIXTURES / "golden"
REGEN = os.environ.get("DEEPGAP_REGEN_GOLDEN") == "1"
# bytes of text above which a golden file is stored xz-compressed (the tree keeps under 10 MB)
XZ_OVER = 8_000
REDACT_KEY = "deepgap-golden-test-key"  # fixed, so --redact's keyed tokens are the same every run

# The archived stores read here (small ones: the file runs in well under 30 s on two cores), unpacked from
# tests/fixtures/archive/<rel>.xz under the same relative paths (the outputs name them).
STORES = (
    "h100/default.sqlite",  # one default sweep: 3 models x eager fp16/fp32 x 11 batches, energy
    "h200/default.sqlite",  # the H200's default sweep with quant, compile-freeze and cudagraph rows
    "h200/quant.sqlite",  # the quant engine's per-layer records (layers, report's quant tables)
    "h100/roofline.sqlite",  # peaks and profile runs, no results
    "two-gpus/all.sqlite",  # H200 and H100 merged: the two-platform answer and ratios
    "h100/session10/serve.sqlite",  # a serve run: serving rows, no results
)


@dataclass
class Case:
    """One golden file: ``deepgap`` commands run in order, and files some of them write (to compare)."""

    name: str
    steps: list[list[str]]
    files: list[str] = field(default_factory=list)  # written under out/ by the steps; CSV/text only
    headings: str | None = None  # an HTML page under out/ whose <h1>-<h4> headings are compared


CASES = [
    Case("show_h100_default", [["show", "h100/default.sqlite"]]),
    Case("show_h200_default", [["show", "h200/default.sqlite"]]),
    Case("show_runs_two_gpus", [["show", "--runs", "two-gpus/all.sqlite"]]),
    Case("show_json_h200_quant", [["show", "--all", "--json", "h200/quant.sqlite"]]),
    Case("show_serving", [["show", "--all", "h100/session10/serve.sqlite"]]),
    Case("recommend_h100_default", [["recommend", "h100/default.sqlite"]]),
    Case("recommend_two_gpus", [["recommend", "two-gpus/all.sqlite"]]),
    Case(
        "recommend_h200_default_slo",
        [["recommend", "--slo-p99", "10ms", "--max-memory", "8GiB", "--json", "h200/default.sqlite"]],
    ),
    # One model: each model's roofline prediction counts its FLOPs op by op (~4 s a model on two cores);
    # resnet50 is the one the report and the two-GPU comparison count anyway (cached in this process).
    Case(
        "compare_h100_h200",
        [
            [
                "compare",
                "h100/default.sqlite",
                "h200/default.sqlite",
                "--model",
                "resnet50",
                "-o",
                "out/compare.csv",
            ]
        ],
        files=["compare.csv"],
    ),
    Case(
        "compare_two_gpus_platforms",
        [
            [
                "compare",
                "two-gpus/all.sqlite",
                "--platforms",
                "H200,H100",
                "--best-only",
                "--model",
                "resnet50",
            ]
        ],
    ),
    Case("export_csv_h200_default", [["export", "--format", "csv", "-o", "-", "h200/default.sqlite"]]),
    Case("export_json_h200_quant", [["export", "--format", "json", "-o", "-", "h200/quant.sqlite"]]),
    Case(
        "export_redacted_h200_quant",
        [["export", "--format", "csv", "--redact", "-o", "-", "h200/quant.sqlite"]],
    ),
    Case(
        "merge_quant_roofline",
        [
            ["merge", "h200/quant.sqlite", "h100/roofline.sqlite", "-o", "out/merged.sqlite"],
            ["merge", "h200/quant.sqlite", "h100/roofline.sqlite", "-o", "out/merged.sqlite", "--json"],
            ["show", "--runs", "out/merged.sqlite"],
            ["show", "--all", "out/merged.sqlite"],
            ["export", "--format", "csv", "-o", "-", "out/merged.sqlite"],
            ["check", "out/merged.sqlite"],
        ],
    ),
    Case(
        "merge_redacted",
        [
            ["merge", "h200/quant.sqlite", "-o", "out/redacted.sqlite", "--redact"],
            ["show", "--runs", "out/redacted.sqlite"],
            ["export", "--format", "csv", "-o", "-", "out/redacted.sqlite"],
        ],
    ),
    Case(
        "report_h200_quant",
        [["report", "--no-redact", "-o", "out/report/report.html", "h200/quant.sqlite"]],
        files=["report/report_files/*.csv"],
        headings="report/report.html",
    ),
    Case("layers_h200_quant", [["layers", "--top", "5", "h200/quant.sqlite"]]),
    Case("check_h100_default", [["check", "h100/default.sqlite"]]),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the archived stores unpacked; the fixtures' bytes are checked unchanged after."""
    originals = [packed(ARCHIVE / rel) for rel in STORES]
    before = {p: p.read_bytes() for p in originals}
    folder = tmp_path_factory.mktemp("golden")
    for rel, src in zip(STORES, originals, strict=True):
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        unpack(src, dst)
    yield folder
    assert {p: p.read_bytes() for p in originals} == before, "an archived store under tests/fixtures/ changed"


@pytest.fixture
def fixed_env(workdir, monkeypatch):
    """Run from the copies' folder, with what the output depends on besides the stores held fixed."""
    monkeypatch.chdir(workdir)
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "JUPYTER_COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("LINES", "50")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("DEEPGAP_REDACT_KEY", REDACT_KEY)
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return workdir


ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def normalise(text: str, workdir: Path) -> str:
    """The text with what legitimately varies between runs made constant.

    Paths are relative already (the commands run from ``workdir``); an absolute one that slips
    through becomes ``<WORKDIR>``. ANSI escapes and trailing blanks go (rich pads centred titles).
    """
    text = ANSI.sub("", text)
    for spelling in {str(workdir), os.path.realpath(workdir)}:
        text = text.replace(spelling, "<WORKDIR>")
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _run(args: list[str]) -> tuple[int, str, str]:
    """``deepgap ARGS`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return int(code or 0), out.getvalue(), err.getvalue()


HEADING = re.compile(r"<h([1-4])[^>]*>(.*?)</h\1>", re.S)


def _headings(html: str) -> str:
    """The page's section headings, one a line: which sections and tables the report has, in order."""
    import html as html_lib

    lines = []
    for m in HEADING.finditer(html):
        text = html_lib.unescape(re.sub(r"<[^>]+>", " ", m.group(2)))
        lines.append(f"h{m.group(1)} " + " ".join(text.split()))
    return "\n".join(lines)


def _capture(case: Case, workdir: Path) -> str:
    """Everything the case compares, as one text: each step's exit code, stdout and stderr, then files."""
    parts = []
    for args in case.steps:
        code, out, err = _run(args)
        parts.append(f"$ deepgap {' '.join(args)}\n[exit {code}]\n--- stdout\n{out}\n--- stderr\n{err}")
    out_dir = workdir / "out"
    for pattern in case.files:
        paths = sorted(out_dir.glob(pattern))
        assert paths, f"{case.name}: no file matches out/{pattern}"
        for path in paths:
            parts.append(f"=== file {path.relative_to(out_dir).as_posix()}\n{path.read_text()}")
    if case.headings:
        page = out_dir / case.headings
        listing = "\n".join(sorted(p.relative_to(out_dir).as_posix() for p in page.parent.rglob("*")))
        parts.append(f"=== files written\n{listing}")
        parts.append(f"=== headings of {case.headings}\n{_headings(page.read_text())}")
    return normalise("\n".join(parts), workdir)


def _golden_path(name: str) -> Path:
    """The case's golden file: ``NAME.txt``, or ``NAME.txt.xz`` when it was too big to keep as text."""
    plain = GOLDEN / f"{name}.txt"
    return plain if plain.exists() or not (GOLDEN / f"{name}.txt.xz").exists() else GOLDEN / f"{name}.txt.xz"


def _read_golden(name: str) -> str:
    path = _golden_path(name)
    if not path.exists():
        pytest.fail(f"no golden file for {name} in {GOLDEN}; create it with DEEPGAP_REGEN_GOLDEN=1")
    data = path.read_bytes()
    return (lzma.decompress(data) if path.suffix == ".xz" else data).decode()


def _write_golden(name: str, text: str) -> None:
    """Write ``NAME.txt`` (or ``NAME.txt.xz`` over XZ_OVER bytes), removing the other spelling."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    plain, zipped = GOLDEN / f"{name}.txt", GOLDEN / f"{name}.txt.xz"
    if len(data) > XZ_OVER:
        zipped.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        plain.unlink(missing_ok=True)
    else:
        plain.write_bytes(data)
        zipped.unlink(missing_ok=True)


def _diff(expected: str, actual: str, name: str, limit: int = 120) -> str:
    """A unified diff of golden vs now, cut to ``limit`` lines: the first differences are the telling ones."""
    lines = list(
        difflib.unified_diff(
            expected.splitlines(),
            actual.splitlines(),
            f"golden/{name}",
            f"now/{name}",
            lineterm="",
            n=2,
        )
    )
    more = f"\n... {len(lines) - limit} more diff lines" if len(lines) > limit else ""
    return _first_difference(expected, actual) + "\n" + "\n".join(lines[:limit]) + more


def _first_difference(expected: str, actual: str, context: int = 40) -> str:
    """Where the first character differs, with a little text around it: a CSV row is one long line, and a
    changed digit in it is hard to find in a line diff."""
    old, new = expected.splitlines(), actual.splitlines()
    for number, (a, b) in enumerate(zip(old, new, strict=False), start=1):
        if a != b:
            col = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            lo = max(col - context, 0)
            return (
                f"first difference: line {number}, column {col + 1}\n"
                f"  golden: ...{a[lo : col + context]!r}\n"
                f"  now:    ...{b[lo : col + context]!r}"
            )
    return f"first difference: line counts {len(old)} (golden) vs {len(new)} (now)"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_output_matches_golden(case: Case, fixed_env: Path):
    actual = _capture(case, fixed_env)
    if REGEN:
        _write_golden(case.name, actual)
        return
    expected = _read_golden(case.name)
    if actual != expected:
        pytest.fail(
            f"`{case.name}` differs from its golden file (regenerate with DEEPGAP_REGEN_GOLDEN=1 only if the "
            f"change is intended):\n{_diff(expected, actual, case.name)}",
            pytrace=False,
        )


def test_every_golden_file_has_a_case():
    """A golden file no case reads is left over from a renamed case: it would pin nothing."""
    names = {c.name for c in CASES}
    assert len(names) == len(CASES)
    stale = [
        p.name for p in GOLDEN.glob("*.txt*") if p.name.removesuffix(".xz").removesuffix(".txt") not in names
    ]
    assert not stale, f"golden files with no case: {stale}"
