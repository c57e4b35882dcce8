"""Kernel clustering and FLOP/byte attribution on a Chrome-trace fixture, and on a live CPU profile."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from repo_paths import FIXTURES

from deepgap.roofline import trace as tr
from deepgap.roofline.cluster import CLUSTERS, RULES, classify, short_name

FIX = str(FIXTURES / "roofline")


def test_every_fixture_kernel_lands_in_its_cluster():
    df = pd.read_csv(os.path.join(FIX, "kernel_names.csv"))
    got = [classify(n) for n in df["name"]]
    pairs = zip(df["name"], got, df["expected_cluster"], strict=True)
    wrong = [(n[:80], g, e) for n, g, e in pairs if g != e]
    assert not wrong
    assert set(df["expected_cluster"]) <= set(CLUSTERS)
    assert {r.cluster for r in RULES} <= set(CLUSTERS)


@pytest.mark.parametrize(
    ("name", "cluster"),
    [
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16",
            "convolution",
        ),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)", "gemm"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, Array1>",
            "copy",
        ),
        ("triton_poi_fused__native_batch_norm_legit_no_training_relu_0", "elementwise"),
        ("triton_red_fused__native_batch_norm_legit_functional_1", "normalization"),
        ("void convert_fp32_to_fp16_kernel(float const*, __half*, long)", "copy"),
        ("void my_project::custom_scan_kernel<float>(float const*, float*, int)", "other"),
    ],
)
def test_rule_precedence(name, cluster):
    assert classify(name) == cluster


def test_short_names():
    assert (
        short_name("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(P::Params)")
        == "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"
    )
    assert short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    assert (
        short_name(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
        )
        == "vectorized_elementwise_kernel<CUDAFunctor_add>"
    )
    assert (
        short_name("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>(float, float)")
        == "bn_fw_inf_1C11_kernel_NCHW"
    )


def test_trace_links_kernels_to_ops_and_shares_flops_and_bytes():
    ks = tr.kernels_from_trace(os.path.join(FIX, "trace_gpu_mini.json"))
    assert len(ks) == 10  # 8 kernels + 1 memcpy + 1 memset; flow events and CPU ops are not kernels
    by = {short_name(k.name): k for k in ks}
    fprop = by[next(n for n in by if "fprop" in n)]
    assert (fprop.op_index, fprop.flops, fprop.cluster) == (0, 1e9, "convolution")
    # the layout transform launched by the same convolution: no FLOPs, its duration's share of the bytes
    assert by["nchwToNhwcKernel"].flops == 0.0
    assert by["nchwToNhwcKernel"].bytes == pytest.approx(3e6 * 3 / 43)
    assert fprop.bytes == pytest.approx(3e6 * 40 / 43)
    # cuBLAS GEMM + split-K reduce: both GEMM, FLOPs by duration (20 µs : 2 µs)
    assert by[next(n for n in by if "xmma_gemm" in n)].flops == pytest.approx(2e8 * 20 / 22)
    assert by["splitKreduce_kernel"].flops == pytest.approx(2e8 * 2 / 22)
    # launched from the autograd thread (another tid): dgrad 60 µs, wgrad 70 µs
    assert by[next(n for n in by if "dgrad" in n)].flops == pytest.approx(2e9 * 60 / 130)
    assert by["Memcpy DtoD"].op_index == 4 and by["Memcpy DtoD"].bytes == 1e6
    assert by["Memset"].op_index is None and by["Memset"].bytes != by["Memset"].bytes  # unattributed: NaN


def test_kernel_and_cluster_tables_from_the_trace():
    kt = tr.kernel_table(tr.kernels_from_trace(os.path.join(FIX, "trace_gpu_mini.json")), steps=1)
    assert kt["time_per_step_s"].sum() == pytest.approx((3 + 40 + 10 + 5 + 20 + 2 + 8 + 1 + 60 + 70) * 1e-6)
    assert kt["flops_per_step"].sum() == pytest.approx(1e9 + 2e8 + 2e9)
    ct = tr.cluster_table(kt).set_index("cluster")
    assert ct.loc["convolution", "time_per_step_s"] == pytest.approx(170e-6)
    assert ct.loc["convolution", "flops_per_step"] == pytest.approx(3e9)
    assert ct.loc["convolution", "achieved_tflops"] == pytest.approx(3e9 / 170e-6 / 1e12)
    assert ct.loc["normalization", "intensity_flop_per_byte"] == pytest.approx(
        5e5 / 4e6
    )  # elementwise estimate
    assert ct.loc["copy", "kernels"] == 3
    assert ct["time_share"].sum() == pytest.approx(1.0)


def test_cpu_profile_attributes_every_counted_flop(tmp_path):
    from deepgap.roofline.flops import model_cost
    from deepgap.roofline.profile import ProfileSpec
    from deepgap.roofline.profile_measure import build_step, profile_step

    for mode in ("infer", "train"):
        spec = ProfileSpec("tinycnn", batch_size=2, mode=mode, warmup=0, steps=1, profiled_steps=2)
        _, step, res = build_step(spec)
        step()
        path = str(tmp_path / f"{mode}.json")
        records = profile_step(step, spec, path)
        kt = tr.kernel_table(tr.kernels_from_trace(path), steps=2)  # records travel inside the saved trace
        assert len(records) > 5
        assert kt["flops_per_step"].sum() == pytest.approx(model_cost("tinycnn", res, mode).flops(2))
        assert set(kt["cluster"]) >= {"convolution", "normalization", "gemm"}
        assert kt["name"].str.startswith("aten::").all()
