"""``show`` and ``export`` name a decode row's fp8 KV cache, so it never looks like the own dtype's row.

From `fixtures_kv`: two configurations that differ only by their cache, measured in two sweeps each.
"""

from __future__ import annotations

import io

import pandas as pd
import pytest
from fixtures_decode import write_decode_store
from fixtures_kv import write_kv_store

from deepgap.cli import main
from deepgap.commands.decode_view import _engine


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kv") / "kv.sqlite")
    write_kv_store(path, sweeps=2)
    return path


def _rows(text: str) -> list[str]:
    return [" ".join(ln.replace("│", " ").split()) for ln in text.splitlines() if "│" in ln]


def test_the_engine_cell():
    base = {"engine": "quant", "decode_step": "cuda-graph", "decode_pdl": "on", "decode_attention": ""}
    assert _engine({**base, "kv_cache": "fp8"}) == "quant (cuda-graph step, fp8 KV cache, PDL)"
    assert _engine({**base, "kv_cache": ""}) == "quant (cuda-graph step, PDL)"
    assert _engine({"engine": "eager", "decode_step": "eager", "kv_cache": "fp8"}) == "eager (fp8 KV cache)"


def test_show_tells_the_two_apart(store, capsys):
    from rich.console import Console

    from deepgap.commands.decode_view import print_decode
    from deepgap.store import Store

    st = Store(store, readonly=True)
    try:
        console = Console(width=600, file=io.StringIO(), record=True)
        assert print_decode(st, console, None) == 4
    finally:
        st.close()
    rows = _rows(console.export_text())
    decode = [r for r in rows if r.startswith("llama-3.1-8b eager")]
    assert sum("eager (fp8 KV cache) bf16 8 128/128" in r for r in decode) == 2, decode  # one per sweep
    assert sum("eager bf16 8 128/128" in r for r in decode) == 2, decode
    # across sweeps: one row per configuration, each of its own two measurements (never the four pooled)
    across = [r for r in rows if "×2" in r]
    assert len(across) == 2 and sum("128/128 fp8 KV cache ×2" in r for r in across) == 1, across
    assert not [r for r in rows if "×4" in r]
    assert main(["show", store]) == 0  # the command prints the same table, and the answer names the cache
    assert "highest output tokens/s: eager bf16 bs8 128/128 fp8 KV cache:" in capsys.readouterr().out


def test_export_has_the_column_only_where_a_row_has_a_format(store, tmp_path):
    out = tmp_path / "kv.csv"
    assert main(["export", store, "-o", str(out)]) == 0
    df = pd.read_csv(out, keep_default_na=False)
    assert sorted(df["kv_cache"]) == ["", "", "fp8", "fp8"]
    plain = str(tmp_path / "plain.sqlite")
    write_decode_store(plain)
    assert main(["export", plain, "-o", str(tmp_path / "plain.csv")]) == 0
    assert "kv_cache" not in pd.read_csv(tmp_path / "plain.csv").columns  # as every decode export before
