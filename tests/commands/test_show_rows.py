"""`show`'s results table tells its rows apart: a device column where the rows hold two GPUs (a merged store's
54 rows of an H100 and an H200 were indistinguishable), and a row without a number says why in full in its
notes (the reason sat under "median ms", cut at 60 characters)."""

from __future__ import annotations

from packed_stores import packed, unpack
from repo_paths import FIXTURES

from deepgap.cli import main


def test_two_gpus_rows_name_their_device(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    store = unpack(packed(FIXTURES / "two_gpus_small.sqlite"), tmp_path / "s.sqlite")
    assert main(["show", str(store), "--all"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if "model" in line)
    assert head.split("┃")[1].strip() == "device", head
    assert "NVIDIA H100" in out and "NVIDIA H200" in out


def test_a_skipped_row_says_why_in_full(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    store = str(tmp_path / "s.sqlite")
    argv = ["run", "--models", "tinycnn", "--engines", "quant", "--precisions", "int8", "--batch-sizes", "1"]
    assert main([*argv, "--device", "cpu", "--quiet", "--store", store]) == 1  # nothing measured
    capsys.readouterr()
    assert main(["show", store]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert (
        "unavailable: quant engine needs a CUDA GPU with int8 tensor cores (compute capability ≥ 8.0" in out
    )
