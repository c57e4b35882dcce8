"""``check`` reads a store as SQLite does (its log included); ``--recover`` keeps every intact row.

The stores are small fixture stores (`fixtures_store.build_store`, milliseconds). A store a killed
writer left is made without killing anything: a copy of the file and its ``-wal`` taken while the
writer's connection is open is byte for byte what ``kill -9`` leaves (no checkpoint happened). One
test does kill a real writer process, polling ``check`` while it writes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store, write_cpu_run, write_gpu_run

from deepgap.store import Store, pages

CORE = ("runs", "results", "samples", "telemetry")


def _counts(path: str) -> dict[str, int]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in CORE}
    finally:
        con.close()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> bytes:
    """A checkpointed fixture store: a GPU run and a CPU run, 236 rows in the core tables."""
    path = str(tmp_path_factory.mktemp("healthy") / "s.sqlite")
    build_store(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    with open(path, "rb") as fh:
        return fh.read()


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[bytes, bytes, dict[str, int]]:
    """A new store whose every transaction is still in its -wal, as a writer killed before a checkpoint
    leaves it: (the file's bytes, the log's bytes, the rows its writer stored)."""
    live = str(tmp_path_factory.mktemp("live") / "s.sqlite")
    writer = Store(live)
    try:
        write_cpu_run(writer)
        write_gpu_run(writer)
        with open(live, "rb") as db, open(live + "-wal", "rb") as wal:
            return db.read(), wal.read(), _counts(live)
    finally:
        writer.close()


def _killed_copy(tmp_path, killed) -> tuple[str, dict[str, int]]:
    dead = tmp_path / "dead" / "s.sqlite"
    dead.parent.mkdir()
    dead.write_bytes(killed[0])
    (tmp_path / "dead" / "s.sqlite-wal").write_bytes(killed[1])
    return str(dead), killed[2]


def test_check_and_show_read_a_new_store_whose_rows_are_all_in_its_log(tmp_path, killed):
    dead, counts = _killed_copy(tmp_path, killed)
    with open(dead, "rb") as fh:  # the main file holds no table yet: everything is in the log
        assert int.from_bytes(fh.read(100)[68:72], "big") == 0
    out = deepgap_cli("check", dead)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == f"{dead}: ok"
    assert f"results: {counts['results']} row(s) read" in out.stdout
    assert "log:" in out.stdout
    shown = deepgap_cli("show", dead, "--runs")
    assert shown.returncode == 0, shown.stderr


def test_following_checks_hint_after_a_kill_keeps_every_row(tmp_path, killed):
    dead, counts = _killed_copy(tmp_path, killed)
    new = str(tmp_path / "new.sqlite")
    out = deepgap_cli("check", dead, "--recover", new)
    assert out.returncode == 0, out.stderr
    assert _counts(new) == counts
    assert f"results: {counts['results']} kept, 0 lost" in out.stdout


def test_check_during_a_write_and_after_a_kill(tmp_path):
    """A real writer process appends results while ``check`` polls; then it is killed with SIGKILL."""
    path = str(tmp_path / "s.sqlite")
    code = (
        "import sys, time\n"
        "from deepgap.core.records import ConfigSpec, Result, Status\n"
        "from deepgap.store import Store\n"
        "s = Store(sys.argv[1]); run = s.begin_run({}, 'deepgap run (test)', {}, '0')\n"
        "print('ready', flush=True)\n"
        "for i in range(1, 100000):\n"
        "    spec = ConfigSpec(model='m', engine='eager', precision='fp32', batch_size=i, device='cpu')\n"
        "    s.record(run, Result(spec=spec, status=Status.ERROR, reason='test'))\n"
        "    time.sleep(0.005)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        seen = []
        for _ in range(5):
            out = deepgap_cli("check", path)
            assert out.returncode == 0, out.stdout + out.stderr
            first = out.stdout.splitlines()[0]
            assert first.startswith(f"{path}: ok (in use by pid {proc.pid} ("), first
            seen.append(int(out.stdout.split("results: ")[1].split()[0]))
        assert seen == sorted(seen) and seen[-1] > 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert os.path.exists(path + "-wal")  # killed: no checkpoint, its last results only in the log
    out = deepgap_cli("check", path)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == f"{path}: ok", out.stdout
    stored = _counts(path)["results"]
    assert stored >= seen[-1]
    new = str(tmp_path / "new.sqlite")
    assert deepgap_cli("check", path, "--recover", new).returncode == 0
    assert _counts(new)["results"] == stored


# --- recovery of damaged copies ----------------------------------------------------------------
def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def _intact_rows(data: bytes, tmp_path, pages_kept: int) -> dict[str, int]:
    """Rows of each core table whose leaf page lies in the first ``pages_kept`` pages (no overflow here),
    and whose result (for samples and telemetry) is intact too: a sample of a lost result cannot be kept.

    The page walk is checked against SQLite on the undamaged file first: every row is on one leaf.
    """
    p = str(tmp_path / "orig.sqlite")
    with open(p, "wb") as fh:
        fh.write(data)
    pf = pages.open_file(p)
    con = sqlite3.connect(f"file:{p}?immutable=1", uri=True)
    roots = dict(con.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'").fetchall())
    kept: dict[str, list[tuple[int, list]]] = {}
    for t in CORE:
        leaves = pages.tree_leaves(pf, roots[t], set())
        chain: set[int] = set()
        per_leaf = {n: list(pages.leaf_rows(pf, n, chain)) for n in leaves}
        assert not chain
        assert sum(map(len, per_leaf.values())) == con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        kept[t] = [r for n, rows in per_leaf.items() if n <= pages_kept for r in rows]
    con.close()
    results = {rowid for rowid, _ in kept["results"]}
    return {
        "runs": len(kept["runs"]),
        "results": len(results),
        "samples": sum(v[0] in results for _, v in kept["samples"]),
        "telemetry": sum(v[1] is None or v[1] in results for _, v in kept["telemetry"]),
    }


def _saved(out) -> dict[str, int]:
    got = {}
    for line in out.stdout.splitlines():
        name, _, rest = line.strip().partition(": ")
        if name in CORE and rest.endswith(" lost") and " kept, " in rest:
            got[name] = int(rest.split()[0])
    return got


@pytest.mark.parametrize("cut", [0.9, 0.75])
def test_recover_keeps_every_intact_row_of_a_truncated_store(tmp_path, healthy, cut):
    page = 4096
    kept_pages = int(len(healthy) * cut) // page
    damaged = tmp_path / "t.sqlite"
    damaged.write_bytes(healthy[: kept_pages * page])
    intact = _intact_rows(healthy, tmp_path, kept_pages)
    assert intact["results"] > 0
    check = deepgap_cli("check", str(damaged))
    assert check.returncode == 2 and "truncated: the file ends at page" in check.stdout
    out = deepgap_cli("check", str(damaged), "--recover", str(tmp_path / "new.sqlite"))
    assert out.returncode == 0, out.stderr
    assert _saved(out) == intact
    assert _counts(str(tmp_path / "new.sqlite")) == intact


@pytest.mark.parametrize("damage", ["magic", "page size", "format bytes"])
def test_recover_keeps_every_row_behind_a_damaged_header(tmp_path, healthy, damage):
    data = {
        "magic": _patch(healthy, 0, b"SQLite format 4\x00"),
        "page size": _patch(healthy, 16, b"\x00\x03"),
        "format bytes": _patch(healthy, 21, b"\x00\x00\x00"),
    }[damage]
    damaged = tmp_path / "h.sqlite"
    damaged.write_bytes(data)
    check = deepgap_cli("check", str(damaged))
    assert check.returncode == 2 and "header: damaged" in check.stdout and "SQLite refuses it" in check.stdout
    out = deepgap_cli("check", str(damaged), "--recover", str(tmp_path / "new.sqlite"))
    assert out.returncode == 0, out.stderr
    assert "header repaired" in out.stdout
    assert _counts(str(tmp_path / "new.sqlite")) == _counts_of(healthy, tmp_path)


def _counts_of(data: bytes, tmp_path) -> dict[str, int]:
    p = tmp_path / "orig.sqlite"
    p.write_bytes(data)
    return _counts(str(p))


@pytest.mark.parametrize("where", ["column name", "table name in its statement", "CREATE keyword"])
def test_a_changed_byte_in_the_schema_is_named_by_check_and_recovered(tmp_path, healthy, where):
    at = healthy.find(b"CREATE TABLE results")
    offset = {
        "column name": healthy.find(b"latency_median_s REAL") + 9,
        "table name in its statement": at + 14,
        "CREATE keyword": at + 7,
    }[where]
    damaged = tmp_path / "c.sqlite"
    damaged.write_bytes(_patch(healthy, offset, b"X"))
    check = deepgap_cli("check", str(damaged))
    assert check.returncode == 2, check.stdout
    schema = next(line for line in check.stdout.splitlines() if line.startswith("  schema: "))
    assert "results" in schema and "damaged" in schema, schema
    if where == "column name":
        assert "'latency_median_s' is stored under the damaged name 'latency_mXdian_s'" in schema
    out = deepgap_cli("check", str(damaged), "--recover", str(tmp_path / "new.sqlite"))
    assert out.returncode == 0, out.stderr
    assert _counts(str(tmp_path / "new.sqlite")) == _counts_of(healthy, tmp_path)
    assert deepgap_cli("check", str(tmp_path / "new.sqlite")).returncode == 0


def test_recover_that_finds_nothing_writes_nothing_and_says_so(tmp_path, healthy):
    damaged = tmp_path / "x.sqlite"
    damaged.write_bytes(healthy[:60])
    out = deepgap_cli("check", str(damaged), "--recover", str(tmp_path / "new.sqlite"))
    assert out.returncode == 2
    assert "nothing in" in out.stderr and "could be recovered" in out.stderr
    assert sorted(os.listdir(tmp_path)) == ["x.sqlite"]
