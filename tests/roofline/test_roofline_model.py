"""Roofline math, the spec-sheet table and the paper's numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from deepgap.roofline import model as rm
from deepgap.roofline.specs import load_specs, load_study, spec_by_gpu, spec_for, spec_peak


def test_attainable_and_ridge_point():
    # H100 SXM spec fp16: 989.4 TFLOP/s over 3,350 GB/s → ridge at 295.3 FLOP/byte
    assert rm.ridge_point(989.4, 3350) == pytest.approx(989.4e12 / 3350e9)
    assert rm.attainable_tflops(10.0, 989.4, 3350) == pytest.approx(33.5)  # memory-bound: 10 × 3.35 TB/s
    assert rm.attainable_tflops(1000.0, 989.4, 3350) == 989.4  # compute-bound
    arr = rm.attainable_tflops(np.array([1.0, 1e4]), 100.0, 1000.0)
    assert arr.tolist() == [1.0, 100.0]
    c = rm.Ceiling("x", "fp16", 100.0, 1000.0, "spec")
    assert c.ridge_flop_per_byte == 100.0
    assert rm.bound(99.0, c) == "memory" and rm.bound(100.0, c) == "compute"


def test_theoretical_time_is_the_papers_equation_and_the_roofline_bound():
    t = rm.theoretical_time(270e9, 8.1)  # the paper's ResNet-50 step on a T4
    assert t.compute_s == pytest.approx(0.03333, rel=1e-3)  # 33 ms — the study prints 33.33 *seconds*
    assert math.isnan(t.memory_s) and t.bound_s == t.compute_s
    t = rm.theoretical_time(1e12, 100.0, bytes_moved=2e10, bandwidth_gb_s=1000.0)
    assert (t.compute_s, t.memory_s, t.bound_s, t.limiter) == (0.01, 0.02, 0.02, "memory")


def test_achieved_tflops_and_fraction():
    assert rm.achieved_tflops(8.2e9, 10_000) == pytest.approx(82.0)
    assert rm.fraction(82.0, 989.4) == pytest.approx(82.0 / 989.4)
    assert math.isnan(rm.fraction(82.0, None))


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("Tesla T4", "NVIDIA T4"),
        ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe"),
    ],
)
def test_device_names_find_their_spec_row(device_name, gpu):
    assert spec_for(device_name)["gpu"] == gpu


def test_spec_table_is_dense_and_carries_the_papers_numbers():
    df = load_specs()
    assert df["source"].str.len().min() > 0
    assert spec_for("AMD EPYC 7B13") is None
    h100 = spec_by_gpu("NVIDIA H100 SXM")
    assert (
        spec_peak(h100, "fp16") == 989.4 and spec_peak(h100, "fp8") == 1978.9
    )  # dense, not 1979/3958 sparse
    assert spec_peak(h100, "memory") == 3350
    assert spec_peak(spec_by_gpu("NVIDIA A100 40GB"), "fp8") is None  # no FP8 path: empty, not zero
    for gpu, fp32, bw in (("NVIDIA T4", 8.1, 320), ("NVIDIA L4", 30.3, 300), ("NVIDIA V100 SXM2", 15.7, 900)):
        row = spec_by_gpu(gpu)
        assert (spec_peak(row, "fp32"), spec_peak(row, "memory")) == (fp32, bw)
    # a tensor rate is never below the FP32 rate of the same GPU
    for _, r in df.iterrows():
        for p in ("tf32", "fp16", "bf16"):
            v = spec_peak(r.to_dict(), p)
            assert v is None or v >= spec_peak(r.to_dict(), "fp32")


def test_paper_rows_and_what_follows_from_them():
    df = load_study()
    assert len(df) == 9 and set(df["gpu"]) == {"NVIDIA T4", "NVIDIA L4", "NVIDIA V100"}
    r = df[(df["model"] == "ResNet50") & (df["gpu"] == "NVIDIA T4")].iloc[0]
    assert r["theoretical_time_s_printed"] / r["theoretical_time_s_recomputed"] == pytest.approx(
        1000, rel=1e-3
    )
    assert r["implied_gflop_per_step"] == pytest.approx(1615 * 0.7590)
    assert (df["intensity_flop_per_byte"] - df["gflop_s"] / df["dram_gb_s"]).abs().max() < 0.05 * df[
        "intensity_flop_per_byte"
    ].max()


def _peaks(device="NVIDIA H100 80GB HBM3"):
    return pd.DataFrame(
        [
            {
                "run_id": "r",
                "name": "fp16",
                "value": 700.0,
                "status": "ok",
                "device_name": device,
                "created_at": 1.0,
            },
            {
                "run_id": "r",
                "name": "memory",
                "value": 3000.0,
                "status": "ok",
                "device_name": device,
                "created_at": 1.0,
            },
            {
                "run_id": "r",
                "name": "fp8",
                "value": None,
                "status": "skipped",
                "device_name": device,
                "created_at": 1.0,
            },
        ]
    )


def test_ceilings_from_spec_and_measured_peaks():
    cs = rm.ceilings("fp16", _peaks(), spec_for("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3")
    assert [(c.source, c.peak_tflops, c.bandwidth_gb_s) for c in cs] == [
        ("spec", 989.4, 3350.0),
        ("measured", 700.0, 3000.0),
    ]
    assert rm.ceilings("fp8", _peaks(), None) == []  # skipped measurement → no measured ceiling


def test_add_roofline_columns_on_a_results_frame():
    results = pd.DataFrame(
        [
            {
                "model": "tinycnn",
                "precision": "fp16",
                "batch_size": 8,
                "resolution": 32,
                "throughput_ips": 1e6,
                "throughput_pipelined_ips": 2e6,
                "flops_per_image": 1.0,
                "device_name": "NVIDIA H100 80GB HBM3",
                "status": "ok",
            }
        ]
    )
    out = rm.add_roofline_columns(results, _peaks())
    r = out.iloc[0]
    from deepgap.roofline.flops import model_cost

    cost = model_cost("tinycnn", 32, "infer")
    assert r["achieved_tflops"] == pytest.approx(cost.flops_per_image * 1e6 / 1e12)
    assert r["achieved_tflops_pipelined"] == pytest.approx(2 * r["achieved_tflops"])
    assert r["bytes_per_batch"] == cost.traffic_bytes(8, "fp16")
    assert r["intensity_flop_per_byte"] == pytest.approx(cost.flops(8) / cost.traffic_bytes(8, "fp16"))
    assert r["fraction_of_spec_peak"] == pytest.approx(r["achieved_tflops"] / 989.4)
    assert r["fraction_of_measured_peak"] == pytest.approx(r["achieved_tflops"] / 700.0)
    assert r["bound"] == "memory"  # a tiny CNN sits far left of the ridge point
    assert "flops_per_image" in out and out["flops_per_image"].iloc[0] == 1.0  # the worker's column is kept


def test_roofline_labels_only_the_fastest_point_per_series_when_crowded():
    from deepgap.roofline.figures import labelled_points

    few = [("resnet18", "fp16", "bs1", 10.0, 1.0, "infer")]
    assert labelled_points(few) == few
    many = [
        (m, p, f"bs{b}", 10.0 * b, float(b), "infer")
        for m in ("resnet18", "resnet50")
        for p in ("fp16", "fp32")
        for b in (1, 2, 4, 8)
    ]
    got = labelled_points(many)
    assert sorted((g[0], g[1], g[2]) for g in got) == [
        ("resnet18", "fp16", "bs8"),
        ("resnet18", "fp32", "bs8"),
        ("resnet50", "fp16", "bs8"),
        ("resnet50", "fp32", "bs8"),
    ]
