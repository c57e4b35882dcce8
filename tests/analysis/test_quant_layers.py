"""The quant engine's per-layer table (`analysis.quant_layers`, `deepgap layers`) and its head's pooling.

Known answers: a layer's TOPS, intensity, roof, floor and bound follow from its ops, bytes and time
against a ceiling given here; the CLI and the report section read real quant rows: the slice
``h100_session7_quant`` (``committed_slices``) of ``results/h100/session7/default.sqlite``, its 24 quant
results (3 models x int8/fp8 x bs1/bs256, two sweeps) with their per-layer records as the run wrote
them. It is representative because the layer table reads only quant rows: ``deepgap layers`` (text and
JSON) and the section's tables and figure are the same for the slice as for the full store.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from clirun import deepgap_cli
from committed_slices import unpacked

from deepgap.analysis.quant_layers import layer_rows, layers_frame, summary
from deepgap.roofline.model import Ceiling

C8 = Ceiling("test int8", "int8", 1000.0, 2000.0, "measured")  # ridge 500 ops/B
C16 = Ceiling("test fp16", "fp16", 500.0, 2000.0, "measured")  # ridge 250 ops/B


def _layer(name, macs, nbytes, q_s, mode="q", fp16_s=1.0):
    return {
        "name": name,
        "macs": macs,
        "bytes": nbytes,
        "q_s": q_s,
        "fp16_s": fp16_s,
        "mode": mode,
        "kernel": "triton",
        "config": "64x64x64 w4 s1",
        "gemm": [10, 20, 30],
    }


def test_a_rows_numbers_follow_from_its_ops_bytes_and_time():
    # memory-bound: 1e9 MAC = 2e9 ops over 1e8 B → 20 ops/B; roof 20 × 2000 GB/s = 40 TOPS; floor 50 µs
    # compute-bound: 2e12 ops over 1e9 B → 2000 ops/B; roof 1000 TOPS; floor 2 ms
    rows = layer_rows(
        "m",
        "int8",
        8,
        [
            [_layer("a", 1e9, 1e8, 100e-6), _layer("b", 1e12, 1e9, 4e-3)],
            [_layer("a", 1e9, 1e8, 80e-6), _layer("b", 1e12, 1e9, 4e-3)],
        ],
        {"q": C8, "fp16": C16},
    )
    a, b = sorted(rows, key=lambda r: r.name)
    assert a.n == 2 and a.time_s == pytest.approx(90e-6)  # median of the two measurements
    assert a.intensity == pytest.approx(20.0) and a.bound == "memory"
    assert a.attainable_tops == pytest.approx(40.0) and a.floor_s == pytest.approx(50e-6)
    assert a.tops == pytest.approx(2e9 / 90e-6 / 1e12) and a.headroom_s == pytest.approx(40e-6)
    assert a.roof_fraction == pytest.approx(a.tops / 40.0)
    assert b.bound == "compute" and b.floor_s == pytest.approx(2e-3) and b.roof_fraction == pytest.approx(0.5)
    assert a.share + b.share == pytest.approx(1.0) and a.gemm == (10, 20, 30)


def test_fp16_rows_use_the_fp16_roof_and_their_fp16_time():
    (r,) = layer_rows(
        "m", "int8", 1, [[_layer("stem", 1e12, 1e9, None, mode="fp16", fp16_s=8e-3)]], {"q": C8, "fp16": C16}
    )
    assert r.time_s == 8e-3 and r.attainable_tops == pytest.approx(500.0) and r.floor_s == pytest.approx(4e-3)


def test_without_a_ceiling_the_roof_columns_are_empty_not_invented():
    (r,) = layer_rows("m", "fp8", 1, [[_layer("a", 1e9, 1e8, 1e-4)]], {"q": None})
    assert math.isnan(r.attainable_tops) and math.isnan(r.headroom_s) and r.bound == ""
    assert r.tops == pytest.approx(20.0)


def test_frame_keeps_quant_ok_rows_and_adds_the_stem_and_head_rows():
    info = {
        "layers": [_layer("l1", 1e9, 1e8, 1e-4)],
        "outside_layers": [_layer("stem", 1e9, 1e8, None, mode="fp16", fp16_s=2e-4)],
    }
    results = pd.DataFrame(
        [
            {
                "device_name": "NVIDIA H100 80GB HBM3",
                "model": "resnet50",
                "precision": "int8",
                "batch_size": 4,
                "engine": "quant",
                "status": "ok",
                "latency_median_s": 5e-4,
                "extra": {"engine_info": info},
            },
            {
                "device_name": "NVIDIA H100 80GB HBM3",
                "model": "resnet50",
                "precision": "int8",
                "batch_size": 4,
                "engine": "quant",
                "status": "error",
                "latency_median_s": 1.0,
                "extra": {"engine_info": info},
            },
            {
                "device_name": "NVIDIA H100 80GB HBM3",
                "model": "resnet50",
                "precision": "fp16",
                "batch_size": 4,
                "engine": "eager",
                "status": "ok",
                "latency_median_s": 1.0,
                "extra": {},
            },
        ]
    )
    frame = layers_frame(results)
    assert sorted(frame["name"]) == ["l1", "stem"]
    assert set(frame["ceiling"]) == {"NVIDIA H100 SXM spec int8", "NVIDIA H100 SXM spec fp16"}
    (s,) = summary(frame).to_dict("records")
    assert s["network_ms"] == pytest.approx(0.5) and s["layers_ms"] == pytest.approx(0.3)
    assert s["outside_layers_ms"] == pytest.approx(0.2)
    assert len(layers_frame(results.iloc[:0])) == 0


def test_kept_fused_pairs_count_once_in_the_time_outside_the_rows():
    """Two rows timed alone (0.1 + 0.2 ms) that the network ran as one fused pair in 0.15 ms, and a pair the
    tuner did not keep: the rows sum to 0.3 ms, the pair saved 0.15, so 0.05 of the 0.2-ms network is outside."""
    pairs = [
        {"first": "a", "second": "b", "separate_s": 3e-4, "pair_s": 1.5e-4, "kept": "pair 64 w4 s3 x2"},
        {"first": "c", "second": "d", "separate_s": 1e-4, "pair_s": None, "kept": None},
    ]
    info = {
        "layers": [_layer("a", 1e9, 1e8, 1e-4), _layer("b", 1e9, 1e8, 2e-4)],
        "pairs": {"mode": "on", "pairs": pairs},
    }
    row = {"device_name": "NVIDIA H200", "model": "resnet50", "precision": "fp8", "batch_size": 8,
           "engine": "quant", "status": "ok", "latency_median_s": 2e-4, "extra": {"engine_info": info}}  # fmt: skip
    (s,) = summary(layers_frame(pd.DataFrame([row]))).to_dict("records")
    assert s["layers_ms"] == pytest.approx(0.3) and s["pairs_saved_ms"] == pytest.approx(0.15)
    assert s["outside_layers_ms"] == pytest.approx(0.05)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float16])
def test_head_pools_before_scaling_and_matches_the_plain_formula(dtype):
    """run_head sums the 8-bit activation (int32 for int8) and scales the pooled vector: same logits."""
    from types import SimpleNamespace

    from deepgap.measure.quant.network import QuantNet

    g = torch.Generator().manual_seed(0)
    batch, hw, c = 3, 49, 64
    raw = torch.randint(-127, 128, (batch * hw, c), generator=g)
    x = raw.to(dtype) if dtype == torch.int8 else (raw.float() / 32).to(dtype)
    fmt = {torch.int8: "int8", torch.float8_e4m3fn: "fp8", torch.float16: "fp16"}[dtype]
    head = SimpleNamespace(inp="t", weight=torch.randn(10, c, generator=g), bias=torch.randn(10, generator=g))
    net = SimpleNamespace(fmts={"t": fmt}, scales={"t": 0.037}, head=head, head_kernel="torch")
    got = QuantNet.run_head(net, x, batch)
    y = x.float() * (0.037 if fmt != "fp16" else 1.0)
    want = torch.nn.functional.linear(y.view(batch, hw, c).mean(1), head.weight, head.bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> str:
    """The quant rows of the H100's session-7 sweep, unpacked once for the module."""
    return str(unpacked("h100_session7_quant", tmp_path_factory.mktemp("quant")))


def test_layers_command_on_the_committed_h100_store(h100):
    r = deepgap_cli(
        "layers", h100, "--model", "resnet50", "--precision", "int8", "--batch-size", "256", "--json"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (s,) = out["summary"]
    assert s["layers"] == 52 and 4.0 < s["layers_ms"] < s["network_ms"]
    assert {row["bound"] for row in out["layers"]} <= {"memory", "compute"}
    text = deepgap_cli("layers", h100, "--model", "resnet50", "--batch-size", "1", "--top", "2")
    assert text.returncode == 0 and "layer" in text.stdout and "headroom" in text.stdout


def test_layers_command_bad_input_is_one_line_and_exit_2(tmp_path, h100):
    r = deepgap_cli("layers", str(tmp_path / "missing.sqlite"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "deepgap: error:" in r.stderr
    assert not (tmp_path / "missing.sqlite").exists()
    r = deepgap_cli("layers", h100, "--model", "vgg16")
    assert r.returncode == 2 and "no quant configuration matches" in r.stderr
    r = deepgap_cli("layers", h100, "--top", "-1")
    assert r.returncode == 2 and "--top" in r.stderr


def test_report_section_on_the_committed_store_and_nothing_without_quant(tmp_path, h100):
    """The report's quant-layers section: a summary per configuration, the top rows, one roofline figure."""
    from deepgap.analysis.quant_layers_section import SECTION, TOP_ROWS, build
    from deepgap.render.sections import ReportContext
    from deepgap.report.sections import registered

    assert SECTION in registered()
    ctx = ReportContext(h100, None, False, [], pd.DataFrame(), pd.DataFrame())
    parts = build(ctx)
    summ, top = parts.tables["quant_layers_summary"], parts.tables["quant_layers"]
    assert len(summ) == 12 and set(summ["model"]) == {"resnet18", "resnet50", "resnet101"}
    assert top.groupby(["model", "precision", "batch_size"]).size().max() == TOP_ROWS
    from deepgap.analysis.quant_layers_section import TABLE_SPECS

    # both tables name the GPU: a two-GPU store's rows of one layer were told apart by nothing
    assert all(
        TABLE_SPECS[t][1][0] == ("device", "device_name") for t in ("quant_layers_summary", "quant_layers")
    )
    (fig,) = parts.figures
    assert fig.png and fig.unavailable is None and len(fig.panels) == 6
    eager = str(unpacked("h100_default_resnet101", tmp_path))  # a real sweep without the quant engine
    assert build(ReportContext(eager, None, False, [], pd.DataFrame(), pd.DataFrame())).tables == {}
