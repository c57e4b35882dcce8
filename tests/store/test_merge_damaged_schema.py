"""merge names a damaged column name of an input's feature table as damage (the fuzz found a traceback)."""

import sqlite3

from clirun import deepgap_cli

from deepgap.store import Store


def _damaged_store(path):
    Store(str(path)).close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA writable_schema=ON")
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name='serve_runs'").fetchone()[0]
    assert "tenant" in sql
    con.execute(
        "UPDATE sqlite_master SET sql=? WHERE name='serve_runs'", (sql.replace("tenant", "tenaxt", 1),)
    )
    con.commit()
    con.close()


def test_merge_of_an_input_with_a_damaged_column_name_is_one_line(tmp_path):
    src, out = tmp_path / "in.sqlite", tmp_path / "out.sqlite"
    _damaged_store(src)
    r = deepgap_cli("merge", str(src), "-o", str(out))
    assert r.returncode == 2, r
    assert "damaged" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()
