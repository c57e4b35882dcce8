"""``deepgap compare`` of two decode stores: decode tokens/s A ÷ B per configuration and length pair.

Before: two stores of decoder runs printed "no results" on both sides and "nothing to compare". From
hand-built stores (`fixtures_decode`): B's every decode step is 1.25× A's, so every ratio is 1.25.
"""

from __future__ import annotations

import json

import pytest
from fixtures_decode import GPU, ROWS, decode_result, write_decode_store

from deepgap.cli import main
from deepgap.core.records import ConfigSpec
from deepgap.store import Store

SLOWER = 1.25


def _slower_store(path: str, rows=ROWS) -> str:
    store = Store(path)
    try:
        env = {"device_name": GPU, "device": "cuda", "gpu_name": GPU, "host": "fixture-host"}
        run = store.begin_run(
            {"workload": "decode", "device": "cuda"}, "deepgap run (fixture B)", env, "0.1.0"
        )
        for model, engine, prec, bs, tpot, j, device, i, o, flagged in rows:
            spec = ConfigSpec(model, engine, prec, bs, device, threads=16 if device == "cpu" else None,
                              resolution=i, input_len=i, output_len=o)  # fmt: skip
            r = decode_result(spec, tpot * SLOWER, j, flagged)
            if device == "cpu":
                r.details.node_env = {"device_name": "Fixture CPU", "device": "cpu", "host": "fixture-host"}
            store.record(run, r)
        store.finish_run(run)
    finally:
        store.close()
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    a = str(d / "a.sqlite")
    write_decode_store(a)
    return a, _slower_store(str(d / "b.sqlite"))


def test_decode_tokens_per_second_a_over_b(stores, capsys):
    a, b = stores
    assert main(["compare", a, b, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    matched = out["decode_matched"]
    # every unflagged GPU configuration and the CPU's, each against its like (GPU with GPU, CPU with CPU)
    assert len(matched) == len(ROWS)
    for r in matched:
        assert r["speedup"] == pytest.approx(SLOWER, rel=1e-6), r
        assert r["speedup_ci_low"] <= r["speedup"] <= r["speedup_ci_high"]
        assert f"{r['input_len']}/{r['output_len']} tokens on " in r["configuration_a"]
    assert {(r["platform_a"], r["platform_b"]) for r in matched} == {
        (GPU, GPU),
        ("Fixture CPU", "Fixture CPU"),
    }
    assert out["decode_best"] and out["a"].endswith("decode rows)")


def test_the_console_prints_decode_tables_not_nothing_to_compare(stores, capsys):
    a, b = stores
    assert main(["compare", a, b]) == 0
    text = capsys.readouterr().out
    assert "decode, matched configurations (same batch and lengths)" in text and "1.25×" in text
    assert "nothing to compare" not in text


def test_a_length_pair_one_side_lacks_is_not_compared(tmp_path, capsys):
    a = str(tmp_path / "a.sqlite")
    write_decode_store(a)
    only_cpu = [r for r in ROWS if r[6] == "cpu"]  # B: the 64/16 rows only
    b = _slower_store(str(tmp_path / "b.sqlite"), only_cpu)
    assert main(["compare", a, b, "--json"]) == 0
    matched = json.loads(capsys.readouterr().out)["decode_matched"]
    assert {(r["input_len"], r["output_len"]) for r in matched} == {(64, 16)} and len(matched) == len(
        only_cpu
    )


def test_a_side_with_two_gpus_of_decode_rows_needs_platforms(stores, tmp_path, capsys):
    a, b = stores
    merged = str(tmp_path / "m.sqlite")
    assert main(["merge", a, _other_gpu(str(tmp_path / "h100.sqlite")), "-o", merged]) == 0
    capsys.readouterr()
    assert main(["compare", merged, b]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds 2 cuda:0 platforms" in err and "--platforms" in err and len(err.splitlines()) == 1, err
    assert main(["compare", merged, "--platforms", "H200,H100", "--json"]) == 0
    matched = json.loads(capsys.readouterr().out)["decode_matched"]
    assert matched and {(r["platform_a"], r["platform_b"]) for r in matched} == {
        (GPU, "NVIDIA H100 (fixture)")
    }
    assert all(r["speedup"] == pytest.approx(SLOWER, rel=1e-6) for r in matched)


def _other_gpu(path: str) -> str:
    """B's slower rows, measured on another GPU (its GPU rows only)."""
    store = Store(path)
    try:
        env = {"device_name": "NVIDIA H100 (fixture)", "device": "cuda", "host": "fixture-host-2"}
        run = store.begin_run(
            {"workload": "decode", "device": "cuda"}, "deepgap run (fixture H100)", env, "0.1.0"
        )
        for model, engine, prec, bs, tpot, j, device, i, o, flagged in ROWS:
            if device == "cuda:0":
                spec = ConfigSpec(model, engine, prec, bs, device, resolution=i, input_len=i, output_len=o)
                store.record(run, decode_result(spec, tpot * SLOWER, j, flagged))
        store.finish_run(run)
    finally:
        store.close()
    return path
