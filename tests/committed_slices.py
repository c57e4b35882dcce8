"""Small slices of the committed stores, for tests that need real stored rows but not the archive itself.

Why: the project rule is that tests own their fixture stores (``tests/fixtures/``); no test opens
``results/``, which holds CSV exports and READMEs only. The raw stores the slices are cut from left the tree
(docs/results.md); they are read from git history, at ``ARCHIVE_COMMIT``, the last commit that held them.
A test that wants rows as a real run wrote them (a quant run's per-layer records, an old schema version,
the exact ``extra_json`` text) reads one of these slices: a copy of a committed store with most rows
deleted by plain sqlite3 (no deepgap code, so the slice holds the bytes the run wrote, in its schema
version), VACUUMed and xz-compressed (``packed_stores``), under ``tests/fixtures/slices/``.

:func:`unpacked` gives a test a writable copy of a slice. Regenerate the slices from the archive (``git
show ARCHIVE_COMMIT:results/SOURCE``, in a clone with full history) with::

    python tests/committed_slices.py

Each `Slice` says what it keeps and why that is enough for the tests that read it.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packed_stores import pack, packed, unpack

HERE = Path(__file__).resolve().parent
SLICES_DIR = HERE / "fixtures" / "slices"
# The last commit whose tree holds the raw result stores (docs/results.md); the slices are cut from it.
ARCHIVE_COMMIT = "433bfb50c7721e72be954b848d42b75739a74e09"


@dataclass(frozen=True)
class Slice:
    """A cut of ``results/SOURCE`` (at ``ARCHIVE_COMMIT``) saved as ``fixtures/slices/NAME.sqlite.xz``.

    ``results``: an SQL condition on the ``results`` table (the rows kept, with their samples), or
    ``"shapes"``: one result per distinct shape of its ``extra_json`` (keys in order, value types, escapes).
    Telemetry samples are dropped (none of the reading tests uses them: the aggregates, answers and layer
    tables of the slices equal the full stores' without them). ``sql``: further statements (the serving
    and roofline tables' cuts).
    """

    name: str
    source: str
    results: str
    why: str
    sql: tuple[str, ...] = ()


SLICES = (
    Slice(
        "h100_default_resnet101",
        "h100/default.sqlite",
        "model = 'resnet101'",
        "the H100 default sweep's ResNet-101 rows (eager fp16/fp32, 11 batches): its answer and flags",
    ),
    Slice(
        "h100_session9_resnet101",
        "h100/session9/default.sqlite",
        "model = 'resnet101'",
        "ResNet-101 of the session-9 sweep (every engine, quant int8 at 0% agreement): issue 35's answer",
    ),
    Slice(
        "h100_session7_quant",
        "h100/session7/default.sqlite",
        "engine = 'quant'",
        "the quant engine's 24 rows (3 models x int8/fp8 x bs1/bs256, two sweeps) with their layer records",
    ),
    *(
        Slice(
            f"h100_{stem.replace('/', '_').replace('-', '_')}",
            f"h100/{stem}.sqlite",
            "shapes",
            "one result per distinct shape of the details the run wrote",
        )
        for stem in (
            "default",
            "session8/accuracy",
            "session8/nvml-access",
            "session8/quant-fused-stem-rows",
            "session8/quant-fused-stem-v1",
            "session8/quant-stem-padding",
            "session8/quant",
        )
    ),
    Slice(
        "h100_roofline",
        "h100/roofline.sqlite",
        "0",
        "the H100's peaks and six profiles (infer and train), per-kernel rows dropped",
        ("DELETE FROM roofline_kernels",),
    ),
    Slice(
        "h100_session8_session_kinds",
        "h100/session8/session-kinds.sqlite",
        "0",
        "a schema-3 store of peaks, profile and serve runs and no results; kernels and requests dropped",
        ("DELETE FROM roofline_kernels", "DELETE FROM serve_requests"),
    ),
    *(
        Slice(
            name,
            source,
            "0",
            "every serving level, capacity and curve row; the first 50 requests of each level",
            ("DELETE FROM serve_requests WHERE idx >= 50",),
        )
        for name, source in (
            ("h100_serving", "h100/serving.sqlite.gz"),
            ("h100_session6_serving_int8", "h100/session6/serving-int8.sqlite.gz"),
            ("h100_session10_serve", "h100/session10/serve.sqlite.gz"),
        )
    ),
)
BY_NAME = {s.name: s for s in SLICES}


def path_of(name: str) -> Path:
    """The committed fixture file of slice ``name``."""
    return packed(SLICES_DIR / f"{name}.sqlite")


def unpacked(name: str, folder: Path) -> Path:
    """A writable copy of slice ``name`` in ``folder`` (``NAME.sqlite``); the fixture file is only read."""
    return unpack(path_of(name), Path(folder) / f"{name}.sqlite")


def details_shape(value):
    """What a JSON value's byte-exact round trip depends on: keys in order, types, and string escapes."""
    if isinstance(value, dict):
        return ("{", tuple((k, details_shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("[", tuple(sorted({details_shape(v) for v in value}, key=repr)))
    if isinstance(value, str):
        return "str" if value.isascii() and json.dumps(value) == f'"{value}"' else "str-escaped"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return "float-special"
    return type(value).__name__


def _one_per_shape(con: sqlite3.Connection) -> str:
    seen: dict = {}
    for rid, text in con.execute("SELECT result_id, extra_json FROM results ORDER BY result_id"):
        seen.setdefault(details_shape(json.loads(text)), rid)
    return f"result_id IN ({', '.join(str(r) for r in sorted(seen.values())) or 'NULL'})"


def make(s: Slice, folder: Path) -> Path:
    """Cut ``s`` from a copy of its committed store (read only) and write its packed fixture file."""
    blob = subprocess.run(
        ["git", "show", f"{ARCHIVE_COMMIT}:results/{s.source}"],
        cwd=HERE.parent,
        capture_output=True,
        check=True,
    ).stdout
    work = folder / f"{s.name}.sqlite"
    work.write_bytes(gzip.decompress(blob) if s.source.endswith(".gz") else blob)
    con = sqlite3.connect(work)
    try:
        keep = _one_per_shape(con) if s.results == "shapes" else s.results
        con.execute(f"DELETE FROM results WHERE NOT ({keep})")
        con.execute("DELETE FROM samples WHERE result_id NOT IN (SELECT result_id FROM results)")
        con.execute("DELETE FROM telemetry")
        for statement in s.sql:
            con.execute(statement)
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    out = path_of(s.name)
    out.write_bytes(pack(work.read_bytes()))
    return out


def main(names: list[str]) -> int:
    """Regenerate the named slices (all without names); print each file's size."""
    SLICES_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for s in [BY_NAME[n] for n in names] if names else SLICES:
            out = make(s, Path(tmp))
            print(f"{out.relative_to(HERE.parent)}: {out.stat().st_size:,} bytes ({s.why})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
