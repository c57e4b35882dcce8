"""A damaged b-tree that hands rows back out of order: `check` and ``--recover`` stay bounded (issue 46).

Found by the damaged-store fuzz, whose xdist worker the kernel's out-of-memory killer ended at 22 GB
in CI: a truncated store's ``results`` cursor gave rowids 1-6, then 0, 0, ... and then an error. The
rowid scan stepped back to rowid 0 after each such row, read the same pages again, and appended them
again, without end. Here the same shape is built by hand: the table's root gets a second child that
is a copy of its first leaf with every rowid set to 0, and every other child past the end of the file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.store.guard import connect
from deepgap.store.rowscan import scan

PAGE = 4096


def _out_of_order(path: str) -> int:
    """Damage ``results`` in the store at ``path`` as described above; returns its first leaf's row count."""
    con = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'results'").fetchone()[0]
    con.close()
    data = bytearray(Path(path).read_bytes())
    assert len(data) % PAGE == 0 and int.from_bytes(data[16:18], "big") == PAGE
    pages = len(data) // PAGE
    r = (root - 1) * PAGE
    cells = int.from_bytes(data[r + 3 : r + 5], "big")
    assert data[r] == 0x05 and cells >= 2  # an interior table page
    cell = [r + int.from_bytes(data[r + 12 + 2 * k : r + 14 + 2 * k], "big") for k in range(cells)]
    first = int.from_bytes(data[cell[0] : cell[0] + 4], "big")
    leaf = bytearray(data[(first - 1) * PAGE : first * PAGE])
    assert leaf[0] == 0x0D
    count = int.from_bytes(leaf[3:5], "big")
    for k in range(count):  # cell: payload-size varint, rowid varint (one byte below 128)
        off = int.from_bytes(leaf[8 + 2 * k : 10 + 2 * k], "big")
        while leaf[off] & 0x80:
            off += 1
        assert leaf[off + 1] < 0x80
        leaf[off + 1] = 0
    data += leaf  # the zero-rowid copy becomes page pages + 1
    data[28:32] = (pages + 1).to_bytes(4, "big")
    data[cell[1] : cell[1] + 4] = (pages + 1).to_bytes(4, "big")
    for c in cell[2:]:  # the other children: past the end of the file
        data[c : c + 4] = (pages + 50).to_bytes(4, "big")
    data[r + 8 : r + 12] = (pages + 50).to_bytes(4, "big")
    with open(path, "wb") as fh:
        fh.write(data)
    return count


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[str, int]:
    path = str(tmp_path_factory.mktemp("tree") / "s.sqlite")
    build_store(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path, _out_of_order(path)


class Counting:
    """A connection that fails the test past a bound on statements (today's scan never ended)."""

    def __init__(self, con):
        self.con, self.n = con, 0

    def execute(self, *args):
        self.n += 1
        assert self.n < 2000, "the rowid scan does not end"
        return self.con.execute(*args)


def test_scan_of_rows_out_of_order_ends_with_each_row_once(damaged):
    path, first_leaf = damaged
    con = connect(path, True, check=False)
    try:
        rows, failure = scan(Counting(con), "results")
    finally:
        con.close()
    ids = [r["_rowid_"] for r in rows]
    assert ids == list(range(1, first_leaf + 1))  # the intact leaf, each row once, none of the zeros
    assert failure and "damaged" in failure


def test_check_and_recover_of_rows_out_of_order(damaged, tmp_path, capsys):
    path, first_leaf = damaged
    before = Path(path).read_bytes()
    assert main(["check", path]) == 2
    out = capsys.readouterr()
    assert "DAMAGED" in out.out and out.err.count("\n") == 1
    new = str(tmp_path / "new.sqlite")
    assert main(["check", path, "--recover", new]) == 0
    capsys.readouterr()
    con = sqlite3.connect(f"file:{new}?immutable=1", uri=True)
    n = con.execute("SELECT count(*) FROM results").fetchone()[0]
    con.close()
    assert n >= first_leaf  # the intact leaf, and what the page-level read finds of the rest
    assert Path(path).read_bytes() == before and sorted(os.listdir(os.path.dirname(path))) == ["s.sqlite"]
