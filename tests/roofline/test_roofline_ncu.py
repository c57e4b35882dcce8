"""The Nsight Compute CSV parser and the paper's formulas on fixture CSVs (no ncu needed)."""

from __future__ import annotations

import os

import pytest
from repo_paths import FIXTURES

from deepgap.roofline import ncu
from deepgap.roofline.profile import ProfileSpec

FIX = str(FIXTURES / "roofline")


def _read(name: str) -> str:
    with open(os.path.join(FIX, name)) as fh:
        return fh.read()


def test_raw_page_parses_one_row_per_launch():
    df = ncu.parse_ncu_csv(_read("ncu_raw_2steps.csv"))
    assert len(df) == 12 and df["id"].tolist() == list(
        range(12)
    )  # ==PROF== lines and the units row are skipped
    assert df.loc[2, "kernel_name"] == "ampere_sgemm_128x64_tn"
    assert df.loc[2, "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == 50_000_000  # "50,000,000"
    assert df.loc[0, "gpu__time_duration.sum"] == 50_000
    assert set(ncu.PAPER_METRICS) <= set(df.columns)


def test_paper_formulas_by_hand():
    s = ncu.paper_summary(ncu.parse_ncu_csv(_read("ncu_raw_2steps.csv")), steps=2)
    time_s = (50_000 + 10_000 + 40_000 + 20_000 + 5_000 + 2_000) * 1e-9  # per step, eq. (1)
    dram = 12e6 + 12e6 + 5e6 + 12e6 + 4e6 + 100_100  # read + write per step
    fp32 = 1e6 + 2 * 50e6 + (0.5e6 + 0.5e6 + 2 * 1e6)  # fadd + fmul + 2·ffma, eq. (3)
    assert s["time_s"] == pytest.approx(time_s)
    assert s["dram_gb_s"] == pytest.approx(dram / 1e9 / time_s)  # eq. (2)
    assert s["flops_per_step"] == pytest.approx(fp32)
    assert s["gflop_s"] == pytest.approx(fp32 / 1e9 / time_s)  # eq. (4)
    assert s["intensity_flop_per_byte"] == pytest.approx(fp32 / dram)  # eq. (5)
    assert s["fp16_flops_per_step"] == 100_000
    assert s["fp64_flops_per_step"] == 1000 + 1000 + 2 * 500
    assert s["sm__inst_executed_pipe_tensor.sum_per_step"] == 1_048_576  # reported raw, not folded into FLOPs
    assert s["launches_per_step"] == 6


def test_kernel_table_clusters_ncu_kernels():
    kt = ncu.kernel_metrics_table(ncu.parse_ncu_csv(_read("ncu_raw_2steps.csv")), steps=2).set_index(
        "short_name"
    )
    assert kt.loc["ampere_sgemm_128x64_tn", "cluster"] == "gemm"
    assert kt.loc["ampere_sgemm_128x64_tn", "flops_per_step"] == 100e6
    assert kt.loc["bn_fw_inf_1C11_kernel_NCHW", "cluster"] == "normalization"
    assert kt.loc["max_pool_forward_nchw", "flops_per_step"] == 100_000  # fp16 counters count too
    assert kt.loc["reduce_kernel", "bytes_per_step"] == 100_100
    assert kt["launches_per_step"].tolist() == [1.0] * 6
    conv = kt[kt["cluster"] == "convolution"].iloc[0]
    assert conv["flops_per_step"] == 0 and conv["metrics"]["sm__inst_executed_pipe_tensor.sum"] == 1_048_576


def test_details_page_with_scaled_units():
    df = ncu.parse_ncu_csv(_read("ncu_details_1launch.csv"))
    r = df.iloc[0]
    assert r["kernel_name"] == "volta_sgemm_128x64_nn"
    assert r["dram__bytes_read.sum"] == pytest.approx(1.5e6)  # Mbyte
    assert r["dram__bytes_write.sum"] == pytest.approx(250e3)  # Kbyte
    assert r["gpu__time_duration.sum"] == pytest.approx(12_350)  # usecond → ns
    assert (
        r["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"]
        != r["smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"]
    )
    s = ncu.paper_summary(df)
    assert s["flops_per_step"] == 2 * 2_097_152  # n/a counts as nothing


def test_empty_or_garbage_output():
    assert len(ncu.parse_ncu_csv("==PROF== nothing profiled\n")) == 0


def test_command_line_and_metric_selection():
    spec = ProfileSpec("resnet50", "fp16", 64, "train", "cuda", profiled_steps=2)
    argv = ncu.child_argv(spec)
    assert argv[1:3] == ["-m", "deepgap.roofline.ncu_child"]
    assert argv[argv.index("--steps") + 1] == "2"
    metrics = ncu.select_metrics({"sm__inst_executed_pipe_tensor", "dram__bytes_read"})
    assert metrics[: len(ncu.PAPER_METRICS)] == list(ncu.PAPER_METRICS)
    assert metrics[len(ncu.PAPER_METRICS) :] == ["sm__inst_executed_pipe_tensor.sum"]
    assert ncu.select_metrics(None) == list(ncu.PAPER_METRICS)
    cmd = ncu.build_command("/x/ncu", argv, metrics, "/tmp/log.csv", launch_count=500)
    for flag in ("--csv", "--page", "raw", "--print-units", "base", "--profile-from-start", "off"):
        assert flag in cmd
    assert cmd[cmd.index("--metrics") + 1] == ",".join(metrics)
    assert cmd[cmd.index("--launch-count") + 1] == "500"
    assert cmd[-len(argv) :] == argv


def test_cpu_profiles_say_why_ncu_does_not_apply(tmp_path):
    out = ncu.run_ncu(ProfileSpec("tinycnn", device="cpu"), str(tmp_path), ncu="/opt/ncu-that-exists-or-not")
    assert out.status == "unavailable" and out.reason.startswith("unavailable: ")
