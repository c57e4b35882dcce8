"""benchmarks/harness_overhead.py: the verdict rule, the per-round summary, and a CPU smoke run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "harness_overhead.py")


def _module():
    spec = importlib.util.spec_from_file_location("harness_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


@pytest.mark.slow
def test_cpu_smoke_run_writes_rounds_and_verdicts(tmp_path):
    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--model", "tinycnn",
                               "--batch-sizes", "1,2", "--rounds", "1", "--iterations", "5", "--warmup", "2",
                               "--out", str(tmp_path), *extra],
                              capture_output=True, text=True, timeout=600)

    p = run()
    assert p.returncode == 0, p.stderr
    out = json.load(open(tmp_path / "harness_overhead.json"))
    assert "round 1/1" in p.stdout and out["complete"] and len(out["round_data"]) == 1
    more = run("--continue")  # a second round on top of the file's first
    assert more.returncode == 0, more.stderr
    out = json.load(open(tmp_path / "harness_overhead.json"))
    assert "round 2/2" in more.stdout and [r["batch_size"] for r in out["rows"]] == [1, 2]
    for r in out["rows"]:
        assert r["rounds"] == 2 and len(r["deepgap_ips"]) == 2 and r["verdict"] in ("agree", "undecided", "differ")
        assert all(v > 0 for v in r["standalone_ips"] + r["deepgap_ips"])
    assert out["round_data"][1]["order"] == "deepgap then standalone"  # ABBA order goes on where it stopped
    other = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--model", "tinycnn", "--batch-sizes",
                            "1", "--rounds", "1", "--out", str(tmp_path), "--continue"],
                           capture_output=True, text=True)
    assert other.returncode != 0 and "other settings" in other.stderr
