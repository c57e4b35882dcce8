"""`Store.decode_frame`'s ``kv_cache`` column, read from the key as ``input_mode`` is ("" for the own dtype).

The forward frame keeps its columns (no ``kv_cache``): every forward view and export is as it was.
"""

from __future__ import annotations

from fixtures_decode import write_decode_store
from fixtures_kv import write_kv_store

from deepgap.store import Store


def _frames(path: str):
    s = Store(path, readonly=True)
    try:
        return s.results_frame(), s.decode_frame()
    finally:
        s.close()


def test_the_column_from_the_key(tmp_path):
    path = str(tmp_path / "kv.sqlite")
    write_kv_store(path)
    forward, dec = _frames(path)
    assert forward.empty and "kv_cache" not in forward
    assert sorted(dec["kv_cache"]) == ["", "fp8"]  # "" (not None): a grouping key keeps the row's group
    fp8 = dec.loc[dec["kv_cache"] == "fp8", "config_key"]
    assert [k for k in dec["config_key"] if '"kv_cache":"fp8"' in k] == list(fp8)


def test_a_store_before_the_axis_reads_all_empty(tmp_path):
    path = str(tmp_path / "d.sqlite")
    write_decode_store(path)
    _, dec = _frames(path)
    assert len(dec) and set(dec["kv_cache"]) == {""}
