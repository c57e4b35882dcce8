"""The whole-network kernel (quant.whole, whole_plan, whole_choice) on the CPU, through Triton's interpreter.

The interpreter runs programs one after another, so a launch here is one program that walks every work item of
every phase, split-K slices included (a grid barrier of one passes at once). Each layer's output is held to
the exact reference of that layer on the kernel's own input and residual: int8 bit for bit, fp8 at the
interpreter's known e4m3 misroundings (`fp8_codes.same_codes`). tests/measure/quant/test_quant_whole_gpu.py runs
one program per SM on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from fp8_codes import same_codes  # noqa: E402
from sm90 import compile_sm90, ptxas_usage  # noqa: E402
from torchvision import models  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import layers, whole, whole_choice, whole_flow, whole_plan  # noqa: E402
from deepgap.measure.quant.calibrate import calibration_images, collect_amax  # noqa: E402
from deepgap.measure.quant.fold import resnet_graph  # noqa: E402
from deepgap.measure.quant.network import WHOLE_STEP, build  # noqa: E402

RES = 32  # 32² images: layer1 is 8×8, layer4 1×1, so a layer is a handful of 64×64 tiles


@pytest.fixture(scope="module")
def graphs():
    """``name -> (graph, ranges)``, each model folded and calibrated once."""
    made = {}

    def get(name):
        if name not in made:
            torch.manual_seed(0)
            graph = resnet_graph(models.get_model(name, weights=None).eval())
            made[name] = (graph, collect_amax(graph, calibration_images(2, RES, 0), method="max"))
        return made[name]

    return get


def _stem_out(net, batch, seed=1):
    x = torch.randn(batch, 3, RES, RES, generator=torch.Generator().manual_seed(seed)).half()
    return net.run_stem(x.contiguous(memory_format=torch.channels_last), "torch").contiguous()


def _each_layer_against_its_reference(net, plan, x, fmt_check):
    """Every layer's output in the arena against `layers.conv_reference` on the kernel's own inputs."""
    seen = {plan.input: x}
    for name in plan.names:
        n = net.convs[name].node
        h, w, _ = net.shapes[n.inp]
        ref = layers.conv_reference(
            net.convs[name], seen[n.inp], (plan.batch, h, w), seen[n.residual] if n.residual else None
        )
        got = plan.view(n.out)
        fmt_check(got, ref, net.convs[name].out_fmt, name)
        seen[n.out] = got


def _exact(got, ref, fmt, name):
    """Bit for bit (8-bit codes compared as bytes; the fp16 last layer as values)."""
    bits = (lambda t: t) if fmt == "fp16" else (lambda t: t.view(torch.uint8))
    assert got.dtype == ref.dtype and torch.equal(bits(got), bits(ref)), name


def _int8_split_plan(graphs, model: str):
    """``model``'s int8 network and its batch-1 plan with the split-K of a 132-SM GPU: eligible, more than 10 layers
    split (layer3 and layer4 have few tiles)."""
    graph, amax = graphs(model)
    net = build(graph, "int8", amax, {}, RES)
    plan = whole_plan.build(net, 1, programs=132)
    assert whole_plan.eligible(net) is None
    assert int((plan.table[:, whole.COL["split"]] > 1).sum()) > 10
    return net, plan


def test_resnet50s_plan_puts_each_downsample_in_its_blocks_second_phase_and_splits_k(graphs):
    """Bottlenecks: 52 layers in 48 phases (4 downsamples share a phase with their block's first 1×1), 47 barriers,
    and the split-K of a 132-SM GPU where layer3 and layer4 have few tiles. The kernel runs this plan on a GPU
    (`test_quant_whole_gpu.py`); its interpreter run is ResNet-18's, below (ResNet-50's took up to 52 s of a full
    run)."""
    _, plan = _int8_split_plan(graphs, "resnet50")
    assert len(plan.names) == 52 and plan.n_phases == 47


def test_resnet18_int8_with_split_k_equals_each_layers_reference_bit_for_bit(graphs):
    """Basic blocks, downsamples (in their block's second phase), stride 2, split-K slices, the fp16 last layer."""
    # the split-K of a 132-SM GPU, walked by one program here
    net, plan = _int8_split_plan(graphs, "resnet18")
    # 3 downsamples share a phase: 16 phases, 15 barriers
    assert len(plan.names) == 19 and plan.n_phases == 15
    x = _stem_out(net, 1)
    out = plan.run(x, programs=1)
    assert out.dtype == torch.float16  # the head reads the last layer in fp16
    _each_layer_against_its_reference(net, plan, x, _exact)
    assert not plan.flagged() and not plan.sync.any() and not plan.cnt.any()  # counters back to zero


def test_resnet18_fp8_at_batch_2_equals_each_layers_reference(graphs):
    graph, amax = graphs("resnet18")
    net = build(graph, "fp8", amax, {}, RES)
    plan = whole_plan.build(net, 2, programs=8)
    x = _stem_out(net, 2)
    plan.run(x, programs=1)

    def codes(got, ref, fmt, name):
        if fmt == "fp16":
            torch.testing.assert_close(got.float(), ref.float(), rtol=2e-3, atol=1e-2)
        else:
            same_codes(got, ref, fmt, min_equal=0.9)

    _each_layer_against_its_reference(net, plan, x, codes)


def test_the_network_runs_its_convolutions_in_one_step_with_the_same_logits(graphs):
    graph, amax = graphs("resnet18")
    net = build(graph, "int8", amax, {}, RES)
    for name in net.convs:
        net.backend[name] = "reference"
    images = torch.randn(1, 3, RES, RES).half().contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        plain = net.forward(images)
        net.whole = whole_plan.build(net, 1, programs=1, flow=True)  # dataflow counters, not barriers
        names = [name for name, _ in net.steps(1)]
        assert names == ["conv1", WHOLE_STEP, "fc"]
        assert torch.equal(net.forward(images), plain)
        assert not net.whole.counters.any() and not net.whole.sync.any()  # zeroed by the last to leave
        # a prefix: layer1 and layer2 in the kernel, layer3 and layer4 in their own kernels after it
        assert whole_choice.stage_ends(net) == ["layer1.1.conv2", "layer2.1.conv2", "layer3.1.conv2"]
        net.whole = whole_plan.build(net, 1, programs=1, upto="layer2.1.conv2")
        names = [name for name, _ in net.steps(1)]
        assert (
            names[:3] == ["conv1", WHOLE_STEP, "layer3.0.conv1"] and len(names) == 2 + 10 + 1
        )  # 10 convs, fc
        assert torch.equal(net.forward(images), plain)


def test_plans_phases_and_splits(graphs):
    graph, amax = graphs("resnet50")
    net = build(graph, "fp8", amax, {}, RES)
    cols = whole.COL
    plan = whole_plan.build(net, 1, programs=132, max_split=1)
    assert not (plan.table[:, cols["split"]] > 1).any()
    assert plan.label.startswith("52 convolutions (to layer4.2.conv3) in 48 phases")
    rows = {name: plan.table[i] for i, name in enumerate(plan.names)}
    # the graph's order is conv1, conv2, downsample, conv3: the downsample joins conv2's phase
    assert (
        rows["layer1.0.conv2"][cols["sync_after"]] == 0
        and rows["layer1.0.downsample"][cols["sync_after"]] == 1
    )
    # a producer's counter below 0: the network's input (the stem's output)
    assert rows["layer1.0.conv1"][cols["x_cnt"]] < 0 and rows["layer1.0.downsample"][cols["x_cnt"]] < 0
    assert rows["layer1.1.conv3"][cols["res_cnt"]] >= 0 and rows["layer1.0.conv3"][cols["has_res"]] == 1
    assert rows["layer1.0.conv3"][cols["res_cnt"]] >= 0 and rows["layer1.0.conv2"][cols["x_cnt"]] >= 0
    assert rows["layer4.2.conv3"][cols["sync_after"]] == 0 and rows["layer4.2.conv3"][cols["out16"]] == 1
    got = [(p.names[-1], p.flow, p.max_split) for p in whole_choice.plans(net, 1, 132)]
    full = [("layer4.2.conv3", f, c) for f in (False, True) for c in (16, 4, 1)]  # caps 16, 4, 1 differ here
    ends = ("layer1.2.conv3", "layer2.3.conv3", "layer3.5.conv3")
    assert got == full + [(e, f, c) for e in ends for f in (False, True) for c in (16, 1)]
    flow = whole_plan.build(net, 1, programs=132, flow=True)
    rows = {name: flow.table[i] for i, name in enumerate(flow.names)}
    conv1, ds, conv3 = rows["layer1.0.conv1"], rows["layer1.0.downsample"], rows["layer1.0.conv3"]
    assert conv1[cols["x_cnt"]] == -1 and conv1[cols["out_cnt"]] == 0  # reads the network's input
    assert rows["layer1.0.conv2"][cols["x_cnt"]] == 0 and rows["layer1.0.conv2"][cols["x_tn"]] == 1  # 64 wide
    assert conv3[cols["res_cnt"]] == ds[cols["out_cnt"]] and conv3[cols["res_tn"]] == 4  # 256 channels
    assert flow.counters.numel() == sum(-(-int(r[cols["m"]]) // 64) for r in flow.table[:-1])
    assert whole_plan._split(tiles=1, steps=72, programs=132, max_split=16) == 12  # largest dividing 72
    assert whole_plan._split(tiles=8, steps=72, programs=132, max_split=16) == 12  # 8 × 12 = 96 ≤ 132
    assert whole_plan._split(tiles=70, steps=72, programs=132, max_split=16) == 1  # fills half the SMs


def test_what_it_cannot_run_is_named(graphs, monkeypatch):
    monkeypatch.setenv("DEEPGAP_QUANT_WHOLE", "on")
    graph, amax = graphs("resnet18")
    mixed = build(graph, "int8", amax, {"layer2.0.conv1": "fp16"}, RES)
    why = whole_plan.eligible(mixed)
    assert "layer2.0.conv1 runs in fp16" in why or "conversions" in why
    with pytest.raises(ValueError, match="cannot run this network"):
        whole_plan.build(mixed, 1, 8)
    net = build(graph, "int8", amax, {}, RES)
    inside = whole_plan.eligible(net, "layer2.0.downsample")  # conv2 reads conv1's output, inside the kernel
    assert inside == "layer2.0.conv2 reads a tensor inside the kernel other than its last output"
    assert whole_plan.eligible(net, "layer1.1.conv2") is None  # a stage's end
    assert whole_plan.eligible(net, "nosuch") == "no convolution 'nosuch'"
    plan = whole_plan.build(net, 1, 8)
    with pytest.raises(ValueError, match="takes a contiguous"):
        plan.run(torch.zeros(3, 64, dtype=torch.int8))
    assert whole_choice.choose_whole(net, 1, RES, "cpu", on=True) == {"mode": "not on a GPU"}
    late = build(graph, "int8", amax, {"layer4.1.conv2": "fp16"}, RES)  # a prefix still runs in the kernel
    cuda = torch.device("cuda")
    assert whole_plan.eligible(late) is not None and whole_choice._not_offered(late, 1, cuda, True) is None
    assert whole_choice._not_offered(mixed, 1, cuda, True).startswith("not eligible: ")
    assert whole_choice.choose_whole(net, 1, RES, "cpu", on=False) == {"mode": "off"}


def test_the_switch_is_checked(monkeypatch, graphs):
    graph, amax = graphs("resnet18")
    net = build(graph, "int8", amax, {}, RES)
    monkeypatch.delenv("DEEPGAP_QUANT_WHOLE", raising=False)  # off by default (slower so far)
    assert whole_choice.choose_whole(net, 1, RES, "cuda", on=True) == {"mode": "off"}
    monkeypatch.setenv("DEEPGAP_QUANT_WHOLE", "sometimes")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_WHOLE"):
        whole_choice.choose_whole(net, 1, RES, "cuda", on=True)


def test_layer_text_says_the_network_runs_it_in_the_kernel():
    @dataclasses.dataclass
    class Row:
        name: str
        config: str

    @dataclasses.dataclass
    class Kept:
        names: list

    rows = [Row("a", "64x64x128"), Row("b", "64x64x128")]
    whole_choice.label_layers(rows, None)
    assert rows[0].config == "64x64x128"
    whole_choice.label_layers(rows, Kept(["a"]))  # the kept plan's layers only
    assert "whole-network kernel" in rows[0].config and rows[1].config == "64x64x128"


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("barrier,flow", [(0, False), (1, False), (1, True)])
def test_compiles_for_sm90_without_spilling(qfmt, barrier, flow):
    """ptxas for sm_90a: one 8-warp program an SM, wgmma for the tiles, 16-byte async copies, no spill."""
    ptr8 = "*i8" if qfmt == "int8" else "*fp8e4nv"
    sig = {
        "table_ptr": "*i64", "gamma_ptr": "*fp32", "act_ptr": ptr8, "in_delta": "i64", "o16_ptr": "*fp16",
        "w_ptr": ptr8, "alpha_ptr": "*fp32", "beta_ptr": "*fp32", "ws_ptr": "*i32" if qfmt == "int8" else "*fp32",
        "cnt_ptr": "*i32", "sync_ptr": "*i32", "n_convs": "i32", "n_phases": "i32", "times_ptr": "*i32",
        "flow_ptr": "*i32", "n_flow": "i32",
    }  # fmt: skip
    const = {"NF": whole.NF, "ACC_INT": qfmt == "int8", "OUT_KIND": 0 if qfmt == "int8" else 1, "BM": whole.BM,
             "BN": whole.BN, "BK": whole.BK, "BARRIER": barrier, "TIMES": False, "SKIP_WORK": False,
             "FLOW": flow, "FENCE": True, "PDL": False}  # fmt: skip
    compiled = compile_sm90(
        whole.whole_kernel, sig, const, aligned=tuple(k for k in sig if k.endswith("_ptr")), num_warps=8,
        num_stages=3, enable_fp_fusion=False,
    )  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "wgmma" in ptx and "cp.async.cg.shared.global" in ptx
    assert ("red.relaxed.gpu.global.add.s32" in ptx) == (barrier == 1 and not flow)  # one thread arrives
    assert (
        "fence.acq_rel.gpu" in ptx
    )  # every wait ends in an acquire fence (an unused acquire add left nothing)
    usage = ptxas_usage(compiled)
    assert usage["spill_stores"] == 0 and usage["registers"] <= 255, usage


@triton.jit
def _blocks(out_ptr, rm0, m, ks, stride, pad, h, w, oh, ow, BM: tl.constexpr):  # noqa: N803
    first, last = whole_flow.row_blocks(rm0, m, ks, stride, pad, h, w, oh, ow, BM)
    tl.store(out_ptr, first)
    tl.store(out_ptr + 1, last)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "h,ks,stride,pad",
    [(56, 3, 1, 1), (56, 3, 2, 1), (56, 1, 2, 0), (14, 3, 1, 1), (7, 3, 1, 1), (8, 1, 1, 0)],
)
def test_a_tile_waits_for_every_input_row_block_it_reads(batch, h, ks, stride, pad):
    """`whole_flow.row_blocks` (in the interpreter) against the blocks each output row's window reads."""
    from deepgap.measure.quant.launch import interpreted, out_size

    oh = out_size(h, ks, stride, pad)
    m = batch * oh * oh
    out = torch.zeros(2, dtype=torch.int64)
    for rm0 in range(0, m, 64):
        interpreted(_blocks)[(1,)](out, rm0, m, ks, stride, pad, h, h, oh, oh, BM=64)
        first, last = out.tolist()
        read = set()
        for r in range(rm0, min(rm0 + 64, m)):
            nb, rest = divmod(r, oh * oh)
            y, x = divmod(rest, oh)
            for dy in range(ks):
                for dx in range(ks):
                    iy, ix = y * stride - pad + dy, x * stride - pad + dx
                    if 0 <= iy < h and 0 <= ix < h:
                        read.add(((nb * h + iy) * h + ix) // 64)
        assert first <= min(read) and max(read) <= last < -(-batch * h * h // 64), (rm0, first, last, read)
        assert last - first <= max(read) - min(read) + 2  # conservative by whole image rows at most
