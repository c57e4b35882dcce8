"""Stores the project once committed (schema version 1) still open, migrate, show, report and merge.

They left ``results/`` with the raw-store archive (docs/results.md) and live on xz-compressed in
``tests/fixtures/archive/`` under their old relative paths. Three small ones, chosen to cover every
table: ``h100/smoke.sqlite`` (sweeps, a profile and a serve run, with ``serve_runs.mean_batch`` stored
as TEXT), ``h200/roofline.sqlite`` (peaks) and ``h100/energy_check.sqlite`` (a sweep with energy
telemetry). Every check works on unpacked copies.
"""

import shutil
import sqlite3
from pathlib import Path

import pytest
from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.cli import main
from deepgap.store import SCHEMA_VERSION, Store

ARCHIVE = FIXTURES / "archive"  # each store as <rel>.xz
STORES = {
    "smoke": "h100/smoke.sqlite",
    "roofline": "h200/roofline.sqlite",
    "energy": "h100/energy_check.sqlite",
}
KINDS = {"smoke": {"sweep", "profile", "serve"}, "roofline": {"peaks"}, "energy": {"sweep"}}


def _raw(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    folder = tmp_path_factory.mktemp("committed")
    out = {}
    for key, rel in STORES.items():
        out[key] = unpack(packed(ARCHIVE / rel), folder / f"{key}.sqlite")
    return out


def test_they_are_version_1_and_read_migrated_in_memory(copies):
    for name, path in copies.items():
        assert _raw(path, "PRAGMA user_version") == [(1,)]
        before = path.read_bytes()
        s = Store(str(path), readonly=True)
        try:
            assert s.file_version == 1
            assert {r["kind"] for r in s.runs()} == KINDS[name]
            assert not any("kind" in r["spec"] for r in s.runs())
            df = s.results_frame()
            cols = [c for c in df.columns if c in {r[1] for r in _raw(path, "PRAGMA table_info(results)")}]
            raw = _raw(path, f"SELECT {', '.join(cols)} FROM results ORDER BY result_id")
            assert [tuple(None if v != v else v for v in r) for r in df[cols].itertuples(index=False)] == [
                tuple(None if v != v else v for v in r) for r in raw
            ]
        finally:
            s.close()
        assert path.read_bytes() == before


def test_writing_migrates_in_place_and_keeps_every_row(copies, tmp_path):
    path = Path(shutil.copy(copies["smoke"], tmp_path / "smoke.sqlite"))
    tables = (
        "results",
        "samples",
        "telemetry",
        "serve_runs",
        "serve_requests",
        "roofline_profiles",
        "roofline_kernels",
    )
    before = {t: _raw(path, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}
    Store(str(path)).close()
    assert _raw(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    after = {t: _raw(path, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}
    mean_batch = [r[0] for r in _raw(path, "SELECT mean_batch FROM serve_runs")]
    assert {t: len(v) for t, v in after.items()} == {t: len(v) for t, v in before.items()}
    assert all(after[t] == before[t] for t in tables if t != "serve_runs")
    assert mean_batch and all(isinstance(v, float) for v in mean_batch)  # was TEXT, now REAL
    i = [r[1] for r in _raw(path, "PRAGMA table_info(serve_runs)")].index("mean_batch")
    assert [r[:i] + (float(r[i]),) + r[i + 1 :] for r in before["serve_runs"]] == after["serve_runs"]
    assert {k for (k,) in _raw(path, "SELECT kind FROM runs")} == KINDS["smoke"]


def test_show_merge_and_report(copies, tmp_path, capsys):
    """Three stores of every table plus ``h200/quant.sqlite``: a four-store merge whose default
    (interactive) report stays ≤ 3 MB (issue 49: plotly.js is embedded once, about 2 MB of it)."""
    quant = unpack(packed(ARCHIVE / "h200/quant.sqlite"), tmp_path / "quant.sqlite")
    inputs = {**copies, "quant": quant}
    for path in inputs.values():
        assert main(["show", str(path)]) == 0
    out = tmp_path / "all.sqlite"
    assert main(["merge", *map(str, inputs.values()), "-o", str(out)]) == 0
    assert _raw(out, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    for table in (
        "runs",
        "results",
        "samples",
        "serve_runs",
        "serve_requests",
        "roofline_peaks",
        "roofline_profiles",
        "roofline_kernels",
    ):
        want = sum(
            _raw(p, f"SELECT count(*) FROM {table}")[0][0]
            for p in inputs.values()
            if _raw(p, f"SELECT count(*) FROM sqlite_master WHERE name = '{table}'")[0][0]
        )
        assert _raw(out, f"SELECT count(*) FROM {table}")[0][0] == want, table
    orphans = _raw(
        out,
        "SELECT count(*) FROM roofline_kernels WHERE profile_id NOT IN "
        "(SELECT profile_id FROM roofline_profiles)",
    )
    assert orphans == [(0,)]
    capsys.readouterr()
    html = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(html)]) == 0
    text = html.read_text()
    assert "ad70c3" in text and "NVIDIA H200" in text and "NVIDIA H100" in text
    assert "Plotly" in text  # the interactive page, the one whose size matters
    assert html.stat().st_size <= 3_000_000, (
        f"a four-store report is {html.stat().st_size / 1e6:.2f} MB > 3 MB"
    )
