"""benchmarks/harness_overhead.py: the verdict rule, the per-round summary, and a CPU smoke run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import repo_paths

ROOT = str(repo_paths.ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "harness_overhead.py")


def _module():
    spec = importlib.util.spec_from_file_location("harness_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def script():
    """The script imported as ``harness_overhead`` (importable by name, so that the fresh processes it starts
    for its arms can unpickle their targets), for running its ``main()`` in this process.

    Why in this process: each ``python harness_overhead.py`` imported deepgap and started a fork server
    that imports torch and torchvision (15-20 s on two cores); the smoke runs check the script's rounds,
    files and verdicts, not its process. test_bad_engine_option_is_one_line_and_exit_2 still runs the
    script as a script.
    """
    folder = os.path.dirname(SCRIPT)
    sys.path.insert(0, folder)
    try:
        yield importlib.import_module("harness_overhead")
    finally:
        sys.path.remove(folder)
        sys.modules.pop("harness_overhead", None)


def _main(script, monkeypatch, capsys, *argv: str) -> str:
    """``python harness_overhead.py ARGV`` in this process; returns what it printed."""
    monkeypatch.setattr(sys, "argv", [SCRIPT, *argv])
    script.main()
    return capsys.readouterr().out


def test_verdict_needs_the_whole_ci_inside_or_outside_the_tolerance():
    v = _module().verdict
    assert v(0.99, 1.01) == "agree"
    assert v(0.97, 1.01) == "undecided"
    assert v(1.03, 1.05) == "differ" and v(0.90, 0.97) == "differ"


def test_summary_is_the_median_of_paired_ratios():
    mod = _module()
    rounds = [{"standalone": {1: s}, "deepgap": {1: d}} for s, d in [(100, 101), (200, 198), (150, 151.5)]]
    (row,) = mod.summarize([1], rounds)
    assert row["ratio_median"] == pytest.approx(1.01)  # 1.01, 0.99, 1.01: drift between rounds cancels
    assert row["ratio_ci"][0] <= row["ratio_median"] <= row["ratio_ci"][1] and row["rounds"] == 3


def test_paired_summary_pools_block_ratios_and_resamples_rounds():
    mod = _module()
    # two rounds of three blocks; the second process runs both arms 40% slower: its ratios stay ~1
    rounds = [
        {"standalone": {1: [100.0, 100.0, 100.0]}, "deepgap": {1: [100.5, 99.8, 100.2]}},
        {"standalone": {1: [60.0, 61.0, 59.0]}, "deepgap": {1: [60.3, 60.9, 59.2]}},
    ]
    (row,) = mod.summarize([1], rounds, paired=True)
    ratios = [1.005, 0.998, 1.002, 60.3 / 60, 60.9 / 61, 59.2 / 59]
    assert row["ratio_median"] == pytest.approx(float(np.median(ratios)))
    assert row["blocks"] == 6 and row["rounds"] == 2 and row["verdict"] == "agree"
    assert row["round_ratios"] == pytest.approx([1.002, 59.2 / 59])
    assert row["standalone_ips"] == [100.0, 60.0]  # each round's median, for the table
    lo, hi = row["ratio_ci"]
    assert min(ratios) <= lo <= row["ratio_median"] <= hi <= max(ratios)
    # the same block ratios without the pairing would say nothing: 100 vs 60 img/s between processes
    unpaired = [{"standalone": {1: s}, "deepgap": {1: d}} for s, d in [(100.0, 60.3), (60.0, 100.5)]]
    assert mod.summarize([1], unpaired)[0]["verdict"] != "agree"


def test_cluster_ci_is_wider_when_rounds_disagree():
    ci = _module().cluster_ci
    same = [np.array([1.0, 1.01, 0.99])] * 4
    apart = [np.array([1.0, 1.01, 0.99]), np.array([1.1, 1.11, 1.09])] * 2
    lo_s, hi_s = ci(same)
    lo_a, hi_a = ci(apart)
    assert 0.99 <= lo_s <= hi_s <= 1.01 and hi_a - lo_a > hi_s - lo_s and hi_a >= 1.09


@pytest.mark.slow
def test_cpu_smoke_run_writes_rounds_and_verdicts(tmp_path, script, monkeypatch, capsys):
    def run(*extra: str) -> str:
        return _main(
            script,
            monkeypatch,
            capsys,
            "--device",
            "cpu",
            "--model",
            "tinycnn",
            "--batch-sizes",
            "1,2",
            "--rounds",
            "1",
            "--iterations",
            "5",
            "--warmup",
            "2",
            "--out",
            str(tmp_path),
            *extra,
        )

    stdout = run()
    out = json.loads((tmp_path / "harness_overhead.json").read_text())
    assert "round 1/1" in stdout and out["complete"] and len(out["round_data"]) == 1
    stdout = run("--continue")  # a second round on top of the file's first
    out = json.loads((tmp_path / "harness_overhead.json").read_text())
    assert "round 2/2" in stdout and [r["batch_size"] for r in out["rows"]] == [1, 2]
    for r in out["rows"]:
        assert r["rounds"] == 2 and len(r["deepgap_ips"]) == 2
        assert r["verdict"] in ("agree", "undecided", "differ")
        assert all(v > 0 for v in r["standalone_ips"] + r["deepgap_ips"])
    assert out["round_data"][1]["order"] == "deepgap then standalone"  # ABBA order goes on where it stopped
    with pytest.raises(SystemExit, match="other settings"):  # the script exits 1 with this line
        _main(
            script,
            monkeypatch,
            capsys,
            "--device",
            "cpu",
            "--model",
            "tinycnn",
            "--batch-sizes",
            "1",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
            "--continue",
        )


@pytest.mark.slow
def test_cpu_smoke_paired_mode_alternates_both_arms_in_one_process(tmp_path, script, monkeypatch, capsys):
    stdout = _main(
        script,
        monkeypatch,
        capsys,
        "--device",
        "cpu",
        "--model",
        "tinycnn",
        "--mode",
        "paired",
        "--batch-sizes",
        "1,2",
        "--rounds",
        "1",
        "--blocks",
        "2",
        "--iterations",
        "5",
        "--warmup",
        "2",
        "--out",
        str(tmp_path),
    )
    assert "round 1/1 (2 blocks" in stdout
    out = json.loads((tmp_path / "harness_overhead_paired.json").read_text())
    assert out["complete"] and out["mode"] == "paired" and out["blocks"] == 2 and out["env"]
    assert not (tmp_path / "harness_overhead.json").exists()  # the processes-mode file is another one
    for r in out["rows"]:
        assert r["rounds"] == 1 and r["blocks"] == 2 and r["verdict"] in ("agree", "undecided", "differ")
    (rnd,) = out["round_data"]
    assert all(len(v) == 2 and min(v) > 0 for arm in ("deepgap", "standalone") for v in rnd[arm].values())


def test_paired_rounds_survive_the_json_round_trip_for_continue(tmp_path):
    mod = _module()
    settings = {
        "model": "m",
        "precision": "fp16",
        "iterations": 5,
        "batch_sizes": [1, 32],
        "mode": "paired",
        "blocks": 2,
    }
    rounds = [
        {"deepgap": {1: [10.0, 11.0], 32: [100.0, 99.0]}, "standalone": {1: [10.0, 10.5], 32: [100.0, 98.0]}}
    ]
    path = str(tmp_path / "h.json")
    mod.save(path, settings, rounds, [1, 32], False, None, "GPU")
    assert mod.load_rounds(path, settings) == rounds  # batch keys back to ints, block lists intact
    saved = json.loads((tmp_path / "h.json").read_text())
    assert [r["blocks"] for r in saved["rows"]] == [2, 2] and saved["complete"] is False
    with pytest.raises(SystemExit, match="other settings"):
        mod.load_rounds(path, {**settings, "blocks": 6})


def test_engine_options_pick_precision_and_file_suffix_and_refuse_what_cannot_run():
    resolve = _module().resolve
    assert resolve("compile-freeze", "cuda", None, True) == ("fp16", "_paired_compile-freeze")
    assert resolve("compile-freeze", "cpu", None, True) == ("fp32", "_paired_compile-freeze")
    assert resolve("quant", "cuda", None, True) == ("int8", "_paired_quant-int8")
    assert resolve("quant", "cuda", "fp8", True) == ("fp8", "_paired_quant-fp8")
    assert resolve("eager", "cuda", None, False) == ("fp16", "")
    for bad in (
        ("quant", "cpu", None, True),
        ("quant", "cuda", "fp16", True),
        ("compile-freeze", "cuda", None, False),
        ("cudagraph", "cpu", None, True),
    ):
        with pytest.raises(ValueError, match="--"):
            resolve(*bad)


def test_bad_engine_option_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--device",
            "cpu",
            "--engine",
            "quant",
            "--mode",
            "paired",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "needs a CUDA device" in p.stderr and not list(tmp_path.iterdir())


def test_paired_summary_adds_the_pipelined_ratio_when_windows_were_measured():
    mod = _module()
    rounds = [
        {
            "standalone": {1: [100.0, 100.0]},
            "deepgap": {1: [86.0, 86.0]},
            "standalone_window": {1: [120.0, 121.0]},
            "deepgap_window": {1: [120.0, 121.0]},
        }
    ]
    (row,) = mod.summarize([1], rounds, paired=True)
    assert row["verdict"] == "differ" and row["pipelined"]["verdict"] == "agree"
    assert row["pipelined"]["ratio_median"] == pytest.approx(1.0)
    assert row["pipelined"]["standalone_ips"] == [120.5]


@pytest.mark.slow
def test_cpu_smoke_paired_compile_freeze_on_tinycnn(tmp_path, script, monkeypatch, capsys):
    _main(
        script,
        monkeypatch,
        capsys,
        "--device",
        "cpu",
        "--model",
        "tinycnn",
        "--mode",
        "paired",
        "--engine",
        "compile-freeze",
        "--batch-sizes",
        "1",
        "--rounds",
        "1",
        "--blocks",
        "2",
        "--iterations",
        "5",
        "--warmup",
        "2",
        "--out",
        str(tmp_path),
    )
    out = json.loads((tmp_path / "harness_overhead_paired_compile-freeze.json").read_text())
    assert out["engine"] == "compile-freeze" and out["complete"]
    (rnd,) = out["round_data"]
    for arm in ("deepgap", "standalone", "deepgap_window", "standalone_window"):
        assert len(rnd[arm]["1"]) == 2 and min(rnd[arm]["1"]) > 0
    assert out["rows"][0]["pipelined"]["verdict"] in ("agree", "undecided", "differ")
