"""`deepgap compare`: ratios with bootstrap CIs on fixtures with known answers; the paper beside a store."""

import json

import numpy as np
import pandas as pd
import pytest
from fixtures_store import build_store, samples_for

from deepgap.analysis import aggregate, prepare
from deepgap.analysis.compare import compare, compare_paper, throughput_ratio
from deepgap.analysis.reference import paper_peaks
from deepgap.cli import main
from deepgap.core.stats import ratio_ci
from deepgap.store import Store


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    a, b = str(d / "a.sqlite"), str(d / "b.sqlite")
    build_store(a, cpu=False)  # Fixture GPU A, with its flags
    build_store(b, cpu=False, name="Fixture GPU B", scale=2.0, flags=False, telemetry=False)  # twice as slow
    return a, b


def _agg(path):
    s = Store(path, readonly=True)
    agg = aggregate(prepare(s.results_frame()))
    return s, agg


def _fn(store):
    def f(ids):
        arrs = [x for i in ids for x in store.samples(i)]
        return np.concatenate(arrs) if arrs else np.empty(0)

    return f


def test_ratio_ci_of_known_speedup(two):
    (sa, a), (sb, b) = _agg(two[0]), _agg(two[1])
    matched, best = compare(a, b, _fn(sa), _fn(sb))
    sa.close()
    sb.close()
    # every matched configuration: B is exactly 2× slower, so A/B = 2 and the 95% CI brackets it tightly
    assert len(matched) == 19
    assert matched["speedup"].to_numpy() == pytest.approx(2.0)
    assert (matched["speedup_ci_low"] < 2.0).all() and (matched["speedup_ci_high"] > 2.0).all()
    assert (matched["speedup_ci_low"] > 1.9).all() and (matched["speedup_ci_high"] < 2.1).all()
    assert matched["configuration_a"].str.contains("on Fixture GPU A").all()
    flagged = matched[matched["flagged"]]
    assert list(flagged["flags"]) == [["A:wrong-output(relL2=0.31)"]]
    # best batch: A's int8 peak is bs32 (bs128 is flagged), B's is bs128 → 16000 / (128 / 0.012) = 1.5
    r = best[(best["model"] == "resnet18") & (best["precision"] == "int8")].iloc[0]
    assert (r["batch_size_a"], r["batch_size_b"]) == (32, 128)
    assert r["speedup"] == pytest.approx(1.5)
    assert r["speedup_ci_low"] < 1.5 < r["speedup_ci_high"]
    assert "bs32" in r["configuration_a"] and "bs128" in r["configuration_b"]


def test_throughput_ratio_matches_stats_ratio_ci():
    la = np.concatenate(samples_for(0.010))
    lb = np.concatenate(samples_for(0.030, shift=5))
    a = {"batch_size": 8, "result_ids": [1], "throughput_ips": 800.0}
    b = {"batch_size": 4, "result_ids": [2], "throughput_ips": 4 / 0.03}
    point, lo, hi, method = throughput_ratio(a, b, lambda ids: la, lambda ids: lb)
    p2, lo2, hi2 = ratio_ci(lb, la)
    assert point == pytest.approx(2 * 3.0) and (lo, hi) == (pytest.approx(2 * lo2), pytest.approx(2 * hi2))
    assert lo < point < hi and "bootstrap" in method
    # without raw samples: the point only, and the CI says why it is missing
    p, lo, hi, method = throughput_ratio(a, b, lambda ids: np.empty(0), lambda ids: lb)
    assert p == pytest.approx(6.0) and np.isnan(lo) and method.startswith("unavailable")


def test_compare_paper_rows(two):
    s, agg = _agg(two[0])
    s.close()
    t = compare_paper(agg, paper_peaks())
    r = t[
        (t["model"] == "resnet18") & (t["precision"] == "fp32") & (t["paper_platform"] == "NVIDIA T4")
    ].iloc[0]
    assert r["ratio_vs_paper"] == pytest.approx((32 / 0.012) / 1289)
    assert r["ratio_ci_low"] < r["ratio_vs_paper"] < r["ratio_ci_high"]
    assert (r["paper_batch"], r["paper_engine"]) == (384, "pytorch-eager")
    assert set(t[t["model"] == "resnet18"]["paper_platform"]) == {
        "NVIDIA T4",
        "NVIDIA L4",
        "Intel Xeon 6 Granite Rapids (24 threads)",
    }


@pytest.mark.parametrize(("name", "read"), [("cmp.parquet", pd.read_parquet), ("cmp.json", pd.read_json)])
def test_cli_compare_writes_the_format_its_suffix_names(two, tmp_path, capsys, name, read):
    """``-o cmp.parquet`` wrote CSV text under a parquet name; it writes what the suffix says, as export does."""
    assert main(["compare", two[0], two[1], "-o", str(tmp_path / name)]) == 0
    back = read(tmp_path / name)
    assert {"best_batch", "matched"} <= set(back["level"]) and back["speedup"].notna().any()


def test_cli_compare_stores_json_and_csv(two, tmp_path, capsys):
    out = tmp_path / "cmp.csv"
    assert main(["compare", two[0], two[1], "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "Fixture GPU A" in data["a"] and "Fixture GPU B" in data["b"]
    best = {(r["model"], r["precision"]): r for r in data["best_batch"]}
    assert best[("resnet50", "fp32")]["speedup"] == pytest.approx(2.0)
    text = out.read_text()
    assert "best_batch" in text and "matched" in text


def test_cli_compare_two_run_ids_in_one_store(tmp_path, capsys):
    p = str(tmp_path / "both.sqlite")
    s = Store(p)
    from fixtures_store import write_gpu_run

    ra = write_gpu_run(s, "Fixture GPU A")
    rb = write_gpu_run(s, "Fixture GPU B", scale=4.0, flags=False, telemetry=False)
    s.close()
    assert main(["compare", ra.run_id, rb.run_id, "--store", p, "--best-only"]) == 0
    out = capsys.readouterr().out
    assert "each side at its best batch" in out and "4.00×" in out and "matched configurations" not in out
    assert "largest unflagged best-batch speedup" in out


def test_cli_compare_paper(two, capsys):
    assert main(["compare", two[0], "--paper", "--model", "resnet50"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA L4" in out and "Granite Rapids" in out and "resnet18" not in out.split("paper =")[1]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["compare", "nope-run"], "two sides"),
        (["compare", "a", "b", "c"], "two sides"),
        (["compare", "nope-a", "nope-b"], "neither a store file nor a run id"),
    ],
)
def test_cli_compare_bad_input(argv, match, tmp_path, capsys):
    assert main([*argv, "--store", str(tmp_path / "missing.sqlite")]) == 2
    assert match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_compare_unknown_run_id(two, tmp_path, capsys):
    assert (
        main(["compare", "20990101-000000-ffffff", two[1], "--store", two[0], "-o", str(tmp_path / "x.csv")])
        == 2
    )
    assert "neither a store file nor a run id" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_large_sample_sets_are_thinned_for_the_ci_only():
    from deepgap.analysis.compare import MAX_BOOTSTRAP_SAMPLES

    la = np.concatenate(samples_for(0.010, n=3 * MAX_BOOTSTRAP_SAMPLES + 1))
    lb = np.concatenate(samples_for(0.025, n=2 * MAX_BOOTSTRAP_SAMPLES + 1))
    a = {"batch_size": 1, "result_ids": [1]}
    point, lo, hi, method = throughput_ratio(a, dict(a), lambda ids: la, lambda ids: lb)
    assert point == pytest.approx(2.5) and lo < 2.5 < hi and "evenly spaced" in method
