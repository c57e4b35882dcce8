"""``deepgap peaks`` / ``deepgap profile`` end to end on the CPU, the store tables, and the figures."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from deepgap.cli import main
from deepgap.roofline import figures, figures_paper, interactive, render, storage
from deepgap.store import Store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("rl") / "s.sqlite")
    assert (
        main(
            [
                "peaks",
                "--device",
                "cpu",
                "--size",
                "128",
                "--bandwidth-mib",
                "8",
                "--repeats",
                "2",
                "--store",
                path,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "profile",
                "--model",
                "tinycnn",
                "--batch-size",
                "2",
                "--mode",
                "infer,train",
                "--warmup",
                "1",
                "--steps",
                "2",
                "--device",
                "cpu",
                "--ncu",
                "--quiet",
                "--store",
                path,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "run",
                "--models",
                "tinycnn",
                "--batch-sizes",
                "2",
                "--iterations",
                "3",
                "--repeats",
                "1",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--target-ci",  # the CPU preset's adaptive repeats (up to 10 s) are not this file's subject
                "off",
                "--quiet",
                "--store",
                path,
            ]
        )
        == 0
    )
    return path


def test_peaks_are_stored_with_reasons(store_path):
    s = Store(store_path, readonly=True)
    try:
        peaks = storage.peaks_frame(s).set_index("name")
        runs = s.runs()
    finally:
        s.close()
    assert set(peaks.index) == {"fp32", "tf32", "fp16", "bf16", "int8", "fp8", "memory"}
    assert peaks.loc["fp32", "status"] == "ok" and peaks.loc["fp32", "value"] > 0
    assert peaks.loc["memory", "unit"] == "GB/s" and peaks.loc["memory", "value"] > 0
    assert peaks.loc["tf32", "status"] == "skipped" and peaks.loc["tf32", "reason"].startswith(
        "unavailable: "
    )
    assert pd.isna(peaks.loc["int8", "value"])  # never a made-up number
    assert peaks.loc["fp32", "details"]["m"] == 128
    assert runs[0]["kind"] == "peaks" and "kind" not in runs[0]["spec"] and runs[0]["env"]["device_name"]


def test_profiles_and_kernels_are_stored(store_path):
    s = Store(store_path, readonly=True)
    try:
        prof = storage.profiles_frame(s)
        kern = storage.kernels_frame(s, source="torch")
    finally:
        s.close()
    assert sorted(prof["mode"]) == ["infer", "train"] and (prof["status"] == "ok").all()
    train = prof[prof["mode"] == "train"].iloc[0]
    assert train["flops_per_step"] == 2 * train["cost"]["flops_per_image"]
    assert train["achieved_tflops"] == pytest.approx(
        train["flops_per_step"] / train["step_time_median_s"] / 1e12
    )
    assert train["attributed_flops_per_step"] == pytest.approx(train["flops_per_step"])
    assert train["ncu_status"] == "unavailable" and "unavailable" in train["ncu_reason"]
    assert len(train["step_times"]) == 2
    tk = kern[kern["profile_id"] == train["profile_id"]]
    assert {"convolution", "normalization", "gemm", "optimizer"} <= set(tk["cluster"])


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "nothing.sqlite"
    assert main(["peaks", "--device", "cpu", "--only", "fp64", "--store", str(path)]) == 2
    assert main(["profile", "--model", "tinycnn", "--precision", "int8", "--store", str(path)]) == 2
    assert main(["profile", "--model", "tinycnn", "--mode", "backward", "--store", str(path)]) == 2
    assert main(["profile", "--model", "no-such-model", "--store", str(path)]) == 2
    # session 33: the ncu settings were accepted without --ncu, and a timeout of 0 s with it
    assert main(["profile", "--model", "tinycnn", "--ncu-launch-count", "5", "--store", str(path)]) == 2
    assert "--ncu-launch-count only applies with --ncu" in capsys.readouterr().err
    assert main(["profile", "--model", "tinycnn", "--ncu", "--ncu-timeout", "0", "--store", str(path)]) == 2
    assert not path.exists()
    assert "deepgap: error:" in capsys.readouterr().err


def test_a_trace_folder_that_cannot_be_made_is_refused_before_measuring(tmp_path, capsys):
    """``--trace-dir afile/x`` failed in the worker after the profile's measurement, stored an error row
    and exited 0 (session 33): it is bad input, refused before anything is written."""
    (tmp_path / "afile").write_text("")
    path = tmp_path / "p.sqlite"
    argv = ["profile", "--model", "tinycnn", "--device", "cpu", "--store", str(path), "--trace-dir"]
    assert main([*argv, str(tmp_path / "afile" / "x")]) == 2
    assert main([*argv, str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 2 and "afile is a file; pass a writable folder" in err[0] and "is a file, not a" in err[1]
    )
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_peaks_that_measured_nothing_exit_1_and_keep_their_rows(tmp_path, capsys):
    """Every asked ceiling unavailable here (fp8 on a CPU): stored with its reason, and exit 1, not 0."""
    path = str(tmp_path / "p.sqlite")
    assert main(["peaks", "--device", "cpu", "--only", "fp8", "--quiet", "--store", path]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("deepgap: no ceiling was measured (1 skipped)")
    s = Store(path, readonly=True)
    try:
        assert list(storage.peaks_frame(s)["status"]) == ["skipped"]
    finally:
        s.close()


def test_figures_and_tables_render_from_the_store(store_path, tmp_path):
    s = Store(store_path, readonly=True)
    try:
        results, peaks = s.results_frame(), storage.peaks_frame(s)
        profiles, kernels = storage.profiles_frame(s), storage.kernels_frame(s)
    finally:
        s.close()
    fig = figures.roofline_figure(figures.Frames(results, peaks, profiles))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.collections) >= 3  # 1 result + 2 profiles (+ legend proxies)
    assert any(line.get_label().startswith("measured fp32") for line in ax.get_lines())
    clusters = figures.Frames(peaks=peaks, profiles=profiles, kernels=kernels)
    fig = figures.cluster_roofline_figure(clusters, source="torch")
    assert len([a for a in fig.axes if a.axison]) == 2
    fig = figures.cluster_roofline_figure(clusters, source="ncu")
    assert "unavailable" in fig.axes[0].texts[0].get_text()
    # its interactive version places the same clusters, a panel per profile, each hoverable
    spec = interactive.cluster_roofline_spec(clusters, source="torch")
    panels = figures.cluster_panels(clusters, "torch")
    assert [p["title"].split("<br>")[0] for p in spec["panels"]] == [p.title for p in panels]
    for i, p in enumerate(panels):
        dots = [t for t in spec["data"] if t["mode"] == "markers" and t["xaxis"] == spec["panels"][i]["x"]]
        assert sorted(t["name"] for t in dots) == sorted(p.on["cluster"])
        assert all(
            len(t["customdata"][0]) == 3 and "% of the step's time" in t["customdata"][0][1] for t in dots
        )
    assert interactive.cluster_roofline_spec(clusters, source="ncu") is None
    tvm = figures_paper.theoretical_vs_measured(profiles, results, peaks)
    assert set(tvm["mode"]) == {"infer", "train"} and (tvm["ceiling"] == "measured").all()
    assert (tvm["theoretical_s"] >= tvm["theoretical_compute_s"]).all()
    paths = render.render_all(store_path, str(tmp_path / "out"))
    assert {os.path.basename(p) for p in paths} >= {
        "roofline_inference.png",
        "clusters_torch.png",
        "theoretical_vs_measured.csv",
        "paper_roofline.png",
    }


def test_spec_ceilings_drawn_for_a_known_gpu():
    rows = pd.DataFrame(
        [
            {
                "model": "tinycnn",
                "mode": "train",
                "precision": "fp16",
                "batch_size": 64,
                "status": "ok",
                "flops_per_step": 2e11,
                "bytes_per_step": 1e9,
                "min_bytes_per_step": 1e8,
                "achieved_tflops": 100.0,
                "step_time_median_s": 2e-3,
                "device_name": "NVIDIA H100 80GB HBM3",
            }
        ]
    )
    fig = figures.roofline_figure(figures.Frames(profiles=rows))
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["NVIDIA H100 SXM spec fp16: 989 TFLOP/s, 3,350 GB/s"]
    tvm = figures_paper.theoretical_vs_measured(rows)
    assert tvm.iloc[0]["theoretical_compute_s"] == pytest.approx(2e11 / 989.4e12)
    assert tvm.iloc[0]["theoretical_s"] == pytest.approx(1e9 / 3350e9)  # 200 FLOP/B < ridge 295: memory-bound
    assert tvm.iloc[0]["limiter"] == "memory"


@pytest.mark.gpu
def test_gpu_peaks_and_profile(tmp_path):
    from deepgap.roofline.peaks_measure import measure_peaks
    from deepgap.roofline.profile import ProfileSpec
    from deepgap.roofline.profile_measure import run_profile

    peaks = {p.name: p for p in measure_peaks("cuda", size=2048, bandwidth_bytes=64 << 20, repeats=2)}
    assert peaks["fp16"].status == "ok" and peaks["memory"].value > 50
    res = run_profile(ProfileSpec("resnet18", "fp16", 8, "train", "cuda", 64, warmup=2, steps=3))
    assert res.status == "ok" and res.details.busy_fraction > 0
    assert res.attributed_flops_per_step == pytest.approx(res.flops_per_step, rel=0.02)
    assert "convolution" in set(res.clusters["cluster"])


def test_report_has_a_roofline_section(store_path):
    """The HTML report of the store that peaks, profile and run wrote carries the inference roofline, the
    paper's roofline and its reference table (the fixture store's full report, which test_report.py checks
    for these too, cost 20 s more here: its ResNets' FLOP counts and forty figures)."""
    from deepgap.report.page import build

    rep = build(store_path)
    names = {f.name: f for f in rep.figures}
    assert names["fig_roofline_paper"].png
    for name in ("fig_roofline_inference", "fig_roofline_train", "fig_roofline_clusters"):  # hoverable
        assert names[name].plotly["data"] and names[name].unavailable is None, name
        assert names[name].png is None  # an interactive page draws no PNG of it (issue 49); --static does
        assert names[name].draw_png().png, name
    assert len(rep.tables["roofline_paper_reference"]) >= 9  # the paper's nine model points


def test_a_cpu_profile_says_its_op_times_are_the_profiled_steps(tmp_path, capsys):
    """On a CPU the op table's times are under torch.profiler (about twice the step timed without it): the
    console said "ms/step" for both and left the reader to wonder why the ops outran the step."""
    argv = ["profile", "--model", "tinycnn", "--batch-size", "2", "--warmup", "1", "--steps", "2"]
    assert main([*argv, "--device", "cpu", "--store", str(tmp_path / "p.sqlite")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "op times below are under torch.profiler:" in out and "timed without it" in out, out


def test_a_text_models_profile_counts_sequences(tmp_path, capsys):
    """Session 33: ``profile --model tinybert`` said "img/s", and its 0.017 GFLOP a step read "0.0"."""
    argv = ["profile", "--model", "tinybert", "--batch-size", "2", "--warmup", "1", "--steps", "2"]
    assert main([*argv, "--device", "cpu", "--store", str(tmp_path / "p.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "seq/s" in out and "img/s" not in out and "0.0 GFLOP" not in out, out


def test_peaks_no_store_beside_a_named_store_is_refused(tmp_path, capsys):
    """It was accepted, and the named store got nothing; now one line, exit 2, no file."""
    path = tmp_path / "p.sqlite"
    assert main(["peaks", "--device", "cpu", "--only", "memory", "--no-store", "--store", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-store stores nothing, but --store names" in err[0]
    assert not path.exists() and os.listdir(tmp_path) == []
