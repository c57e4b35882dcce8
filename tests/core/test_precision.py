"""The precision table (`deepgap.core.precision.PRECISIONS`) is complete, and every consumer reads it.

The point of one table: adding a precision is one entry (plus the engines that run it). So beside checking
the entries, a fake precision is put into the table and each consumer must see it without any other edit.
"""

import dataclasses
import re
import subprocess
import sys

import pytest

from deepgap.core import precision as prec
from deepgap.core.precision import PRECISIONS, DeviceCaps, Precision
from deepgap.measure.device import set_tf32, torch_dtype

FAKE = Precision(
    "fp6",
    "float16",
    3,
    0.5,
    0.9,
    "#123456",
    "navy",
    (9, 9),
    "fp6_tflops",
    peak_unit="POPS",
    peak_fallback="fp16",
    quantized=True,
)


@pytest.fixture
def fake(monkeypatch):
    """A sixth-plus precision in the table, for as long as the test runs."""
    monkeypatch.setitem(PRECISIONS, FAKE.name, FAKE)
    return FAKE


def test_every_precision_an_engine_declares_is_in_the_table():
    from deepgap.measure.engines import ENGINES, load_engines

    load_engines()
    declared = {p for name in ENGINES.names() for p in ENGINES.get(name).precisions}
    assert declared and declared <= set(PRECISIONS), declared - set(PRECISIONS)
    assert set(PRECISIONS) <= declared, "a precision no engine runs"


def test_every_entry_is_complete_and_consistent():
    import pandas as pd
    import torch

    from deepgap.roofline.specs import SPEC_FILE, _data_path

    columns = set(pd.read_csv(_data_path(SPEC_FILE), nrows=0).columns)
    assert list(PRECISIONS)[0] == "fp32"  # the reference every other precision is checked against
    for name, p in PRECISIONS.items():
        assert p.name == name
        for f in dataclasses.fields(p):
            if f.name != "peak_fallback":
                assert getattr(p, f.name) is not None and getattr(p, f.name) != "", (name, f.name)
        dtype = torch_dtype(name)
        assert isinstance(dtype, torch.dtype) and dtype.itemsize == p.itemsize, name
        assert 0 < p.rel_l2_bound < 1 and 0 < p.cosine_floor < 1, name
        assert re.fullmatch(r"#[0-9a-f]{6}", p.colour), name
        assert len(p.min_cc) == 2 and all(isinstance(v, int) for v in p.min_cc), name
        assert p.peak_column in columns, name
        assert p.peak_fallback is None or p.peak_fallback in PRECISIONS, name
    assert len({p.colour for p in PRECISIONS.values()}) == len(PRECISIONS)  # figures tell them apart
    assert prec.quantized_names() == ("int8", "fp8")
    assert prec.float_names() == prec.FLOAT_PRECISIONS == ("fp32", "tf32", "fp16", "bf16")


def test_importing_the_table_does_not_import_torch():
    code = "import sys, deepgap.core.precision; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_support_keeps_its_rules():
    cpu = DeviceCaps("cpu", "cpu", "cpu")
    turing = DeviceCaps("cuda:0", "cuda", "T4", (7, 5))
    maxwell = DeviceCaps("cuda:0", "cuda", "M40", (5, 2))
    assert prec.float_precision_support("fp32", cpu) is None
    assert prec.float_precision_support("bf16", cpu) is None
    assert "tensor-core mode" in prec.float_precision_support("tf32", cpu)
    assert prec.float_precision_support("bf16", turing) == "bf16 needs compute capability ≥ 8.0; T4 has 7.5"
    assert prec.float_precision_support("fp16", turing) is None
    assert prec.float_precision_support("fp16", maxwell) == "fp16 needs compute capability ≥ 5.3; M40 has 5.2"
    assert "quantizing engine" in prec.float_precision_support("int8", turing)
    assert prec.device_support("int8", turing) is None
    assert prec.device_support("fp8", DeviceCaps("cuda:0", "cuda", "A100", (8, 0))).startswith("fp8 needs")


def test_consumers_agree_with_the_table():
    from deepgap.analysis import accuracy
    from deepgap.measure import correctness
    from deepgap.render import style as figure_style
    from deepgap.roofline import figures as roofline_figures
    from deepgap.roofline import flops, specs

    row = specs.spec_by_gpu("NVIDIA H100 SXM")
    for name, p in PRECISIONS.items():
        assert figure_style.PREC_COLORS[name] == roofline_figures.PREC_COLORS[name] == p.colour
        assert figure_style.color({"precision": name}) == p.colour
        assert flops.ITEMSIZE_BYTES[name] == p.itemsize
        assert correctness.REL_L2_BOUND[name] == p.rel_l2_bound
        assert correctness.COSINE_FLOOR[name] == p.cosine_floor
        assert specs.peak_column(name) == p.peak_column
        assert specs.spec_peak(row, name) == float(row[p.peak_column])
        assert (accuracy.threshold(name, None) is not None) == p.quantized
    assert figure_style.color({"precision": "fp64"}) == figure_style.OTHER_COLOR
    assert specs.peak_column("memory") == "memory_bandwidth_gb_s"


def test_a_new_precision_in_the_table_reaches_every_consumer(fake):
    import torch

    from deepgap.analysis import accuracy, tables
    from deepgap.measure import correctness
    from deepgap.render import style as figure_style
    from deepgap.report import compare_console
    from deepgap.roofline import figures as roofline_figures
    from deepgap.roofline import flops, specs
    from deepgap.serving.capacity.planner import Curve

    # colour, in every figure
    assert figure_style.color({"precision": "fp6"}) == "#123456"
    assert roofline_figures.PREC_COLORS["fp6"] == "#123456" and "fp6" in figure_style.PREC_COLORS
    # bytes per element, in the roofline
    assert flops.ITEMSIZE_BYTES["fp6"] == 3
    cost = flops.ModelCost("m", 8, "infer", 1.0, 0.0, 10, 0, 1, 1, 1.0, 10.0)
    assert cost.param_bytes("fp6") == 30 and cost.traffic_bytes(2, "fp6") == 3 * (10 + 2)
    # quantized: the accuracy floor and the places that show a quantized row's accuracy
    assert prec.is_quantized("fp6") and "fp6" in prec.quantized_names() and "fp6" not in prec.FLOAT_PRECISIONS
    assert accuracy.threshold("fp6", None) == accuracy.DEFAULT_MIN
    row = {"precision": "fp6", "configuration_a": "x", "accuracy_a": "95.0%"}
    import pandas as pd

    [(_, cell)] = compare_console._accuracy_column(pd.DataFrame([row]), "A accuracy", "_a")
    assert cell(row) == "95.0%"  # compare's accuracy column, beside the configuration
    curve = Curve({"model": "m", "engine": "e", "precision": "fp6"}, None, "sweep", accuracy="top-1 95%")
    assert curve.label().endswith("(sweep; top-1 95%)")
    assert "quantizing engine" in prec.float_precision_support("fp6", DeviceCaps("cpu", "cpu", "cpu"))
    # minimum compute capability
    why = prec.device_support("fp6", DeviceCaps("cuda:0", "cuda", "H100", (9, 0)))
    assert why == "fp6 needs compute capability ≥ 9.9; H100 has 9.0"
    assert prec.device_support("fp6", DeviceCaps("cuda:0", "cuda", "Next", (10, 0))) is None
    # its datasheet column, and the fallback when a sheet has none
    assert specs.spec_peak({"fp6_tflops": 123.0}, "fp6") == 123.0
    assert tables._pct_of_peak("NVIDIA H100 SXM", "fp6", 1.0) == pytest.approx(
        100.0 / specs.spec_peak(specs.spec_for("NVIDIA H100 SXM"), "fp16")
    )
    # its correctness tolerance
    ref = torch.ones(2, 10)
    out = ref.clone()
    out[:, 0] += 2.0  # relative L2 error 2/√10 ≈ 0.63 (> 0.5), cosine ≈ 0.89 (< 0.9)
    agreement = correctness.compare(out, ref, "fp6")
    assert agreement.bound_rel_l2 == 0.5 and agreement.flagged
    out[:, 0] = ref[:, 0] + 1.2  # ≈ 0.38 and ≈ 0.94: within fp6's bounds, beyond int8's
    assert not correctness.compare(out, ref, "fp6").flagged and correctness.compare(out, ref, "int8").flagged


def test_a_quantizing_engine_checks_the_tables_compute_capability(fake, monkeypatch):
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine

    trt = type(get_engine("tensorrt"))
    monkeypatch.setattr(trt, "precisions", (*trt.precisions, "fp6"))
    spec = ConfigSpec(
        model="tinycnn", engine="tensorrt", precision="fp6", batch_size=1, device="cuda:0", resolution=32
    )
    assert trt().supports(spec, DeviceCaps("cuda:0", "cuda", "H100", (9, 0))) == (
        "tensorrt fp6 needs compute capability ≥ 9.9; H100 has 9.0"
    )
    assert trt().supports(spec, DeviceCaps("cuda:0", "cuda", "Next", (10, 0))) is None
    int8 = dataclasses.replace(spec, precision="int8")
    assert trt().supports(int8, DeviceCaps("cuda:0", "cuda", "V100", (7, 0))) == (
        "tensorrt int8 needs compute capability ≥ 7.5; V100 has 7.0"
    )


def test_set_tf32_follows_the_table(fake, monkeypatch):
    import torch

    monkeypatch.setitem(PRECISIONS, "fp6", dataclasses.replace(FAKE, allow_tf32=True))
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        set_tf32("fp6")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        set_tf32("fp32")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
