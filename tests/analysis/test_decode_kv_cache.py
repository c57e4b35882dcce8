"""Decode analysis with an fp8 KV cache beside the decoder's own: never pooled, compared like with like, named.

From `fixtures_kv` (two configurations differing only by their cache; the fp8 one's TPOT 3.2 ms, the
other's 4.0 ms) and `fixtures_decode`'s store of the plain decode rows.
"""

from __future__ import annotations

import json

import pytest
from fixtures_kv import KV_ROWS, write_kv_store

from deepgap.analysis import decode_answer as da
from deepgap.analysis.decode import decode_agg, decode_table
from deepgap.analysis.decode_roofline import itemsizes
from deepgap.analysis.decode_section import TABLE_SPECS
from deepgap.cli import main
from deepgap.store import Store


def _frame(path: str):
    s = Store(path, readonly=True)
    try:
        return s.decode_frame(), s.samples
    finally:
        s.close()


@pytest.fixture(scope="module")
def kv_store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kv") / "a.sqlite")
    write_kv_store(path, sweeps=2)
    return path


def test_the_aggregate_keeps_each_format_apart(kv_store):
    frame, _ = _frame(kv_store)
    agg = decode_agg(frame).sort_values("kv_cache")
    assert list(agg["kv_cache"]) == ["", "fp8"] and list(agg["n_measurements"]) == [2, 2]
    assert list(agg["throughput_ips"]) == pytest.approx([8 / 4.0e-3, 8 / 3.2e-3])


def test_the_table_and_the_roofline(kv_store):
    frame, _ = _frame(kv_store)
    tab = decode_table(frame).sort_values(["kv_cache", "sweep"])
    assert list(tab["kv_cache"]) == ["", "", "fp8", "fp8"]
    own, fp8 = tab.iloc[0], tab.iloc[2]
    assert fp8["kv_bytes_per_step"] == pytest.approx(own["kv_bytes_per_step"] / 2)  # 1 byte, not bf16's 2
    assert fp8["weight_bytes_per_step"] == own["weight_bytes_per_step"]
    assert itemsizes("bf16", "fp8").kv == 1 and itemsizes("fp8", "fp8").linear == 1
    assert itemsizes("fp32", "").kv == 4 and itemsizes("fp8").kv == 2
    engine = dict(TABLE_SPECS["decode"][1])["engine"]
    assert [engine(r) for r in (own.to_dict(), fp8.to_dict())] == ["eager", "eager · fp8 KV cache"]


def test_the_answer_names_the_cache(kv_store):
    frame, _ = _frame(kv_store)
    tab = decode_table(frame)
    (a,) = da.decode_answers(tab)
    assert da.short(a.choice["throughput"]) == "eager bf16 bs8 128/128 fp8 KV cache" and a.considered == 4
    ok, _ = da.candidates(tab)  # both formats are candidates, each named as it is
    assert sorted({da.short(r) for r in ok.to_dict("records")}) == [
        "eager bf16 bs8 128/128",
        "eager bf16 bs8 128/128 fp8 KV cache",
    ]


def test_compare_pairs_each_format_with_its_own(kv_store, tmp_path, capsys):
    b = str(tmp_path / "b.sqlite")
    write_kv_store(b, rows=KV_ROWS, slower=1.25)
    assert main(["compare", kv_store, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    matched = out["decode_matched"]
    assert sorted(r["kv_cache"] for r in matched) == ["", "fp8"]
    for r in matched:  # each A against the B of its own cache: 1.25×, never 4.0 / 3.2 or 3.2 × 1.25 / 4.0
        assert r["speedup"] == pytest.approx(1.25, rel=1e-6), r
        assert (
            ("fp8 KV cache" in r["configuration_a"])
            == (r["kv_cache"] == "fp8")
            == ("fp8 KV cache" in r["configuration_b"])
        )
    only_fp8 = str(tmp_path / "c.sqlite")
    write_kv_store(only_fp8, rows=KV_ROWS[1:])
    assert main(["compare", kv_store, only_fp8, "--json"]) == 0
    assert [r["kv_cache"] for r in json.loads(capsys.readouterr().out)["decode_matched"]] == ["fp8"]


def test_the_console_comparison_says_which_cache(kv_store, tmp_path, capsys):
    b = str(tmp_path / "b.sqlite")
    write_kv_store(b, slower=1.25)
    assert main(["compare", kv_store, b]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "128/128 · fp8 KV cache" in text and "128/128 · own dtype" in text
