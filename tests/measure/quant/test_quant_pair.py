"""The fused pair of 1×1 convolutions (quant.pair) on the CPU, which pairs a network offers, and how the net runs them.

The Triton interpreter runs the kernel as written (TMA descriptors, the persistent tile walk, the resident
weights). int8 must equal the exact reference of the two layers one after the other bit for bit; fp8 may
differ only at the interpreter's known e4m3 misroundings (`fp8_codes.same_codes`), and its U is held to the
reference of the second layer on the kernel's own T. tests/measure/quant/test_quant_pair_gpu.py checks the
kernel against the separate kernels on a Hopper GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from fp8_codes import same_codes  # noqa: E402
from sm90 import compile_sm90, ptxas_usage  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import layers, pair, pair_choice  # noqa: E402
from deepgap.measure.quant.fold import ConvNode  # noqa: E402
from deepgap.measure.quant.pair import PairConfig  # noqa: E402

CFG = PairConfig(32, 4, 2)  # 32-row tiles: the interpreter's few programs walk several


def _pair(qfmt, k1, n1, n2, res=True, relu2=True, seed=0):
    """Two chained quantized 1×1 layers (first with a residual if ``res``) and rows of input and residual."""
    g = torch.Generator().manual_seed(seed)
    a = ConvNode("c3", "a", "t", torch.randn(n1, k1, 1, 1, generator=g) * 0.1, torch.randn(n1, generator=g),
                 1, 0, True, "r" if res else None)  # fmt: skip
    b = ConvNode("c1", "t", "u", torch.randn(n2, n1, 1, 1, generator=g) * 0.1, torch.randn(n2, generator=g),
                 1, 0, relu2, None)  # fmt: skip
    fmts = dict.fromkeys("atur", qfmt)
    scales = {"a": 0.05, "t": 0.08, "u": 0.1, "r": 0.03}
    return layers.make_qconv(a, qfmt, "q", fmts, scales), layers.make_qconv(b, qfmt, "q", fmts, scales), g


def _inputs(qfmt, rows, k1, n1, g, res=True):
    x = layers.quantize_act(torch.randn(rows, k1, generator=g) * 40, qfmt)
    r = layers.quantize_act(torch.randn(rows, n1, generator=g) * 40, qfmt) if res else None
    return x, r


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("t_store", [0, 1, 2], ids=["tma-early", "tma-late", "ptr"])
@pytest.mark.parametrize("res,relu2", [(True, True), (False, False)], ids=["res", "nores-norelu"])
def test_the_pair_equals_the_two_layers_one_after_the_other(qfmt, t_store, res, relu2):
    first, second, g = _pair(qfmt, 32, 64, 32, res, relu2)
    x, r = _inputs(qfmt, 100, 32, 64, g, res)  # 100 rows: the last 32-row tile is partial
    t, u = pair.run(first, second, x, r, dataclasses.replace(CFG, t_store=t_store))
    t_ref, _ = pair.reference(first, second, x, r)
    same_codes(t, t_ref, qfmt, min_equal=0.9)
    u_ref = layers.conv_reference(second, t, (1, 100, 1), None)  # the second layer on the kernel's own T
    same_codes(u, u_ref, qfmt, min_equal=0.9)
    if qfmt == "int8":
        assert torch.equal(u, pair.reference(first, second, x, r)[1])


@pytest.mark.parametrize("programs", [1, 2, 7])
def test_the_walk_writes_every_tile_of_both_outputs_once_whatever_the_grid(programs):
    """5 row tiles (the last partial) over 1, 2 or 7 (> tiles) programs; poisoned outputs show a missed tile."""
    first, second, g = _pair("int8", 32, 64, 32, seed=programs)
    x, r = _inputs("int8", 150, 32, 64, g)
    out = (torch.full((150, 64), -128, dtype=torch.int8), torch.full((150, 32), -128, dtype=torch.int8))
    t, u = pair.run(first, second, x, r, CFG, out=out, num_programs=programs)
    assert t is out[0] and u is out[1]
    t_ref, u_ref = pair.reference(first, second, x, r)
    assert torch.equal(t, t_ref) and torch.equal(u, u_ref)  # no kernel writes −128 (outputs clamp to ±127)


def test_the_launch_refuses_what_the_kernel_cannot_run():
    first, second, g = _pair("int8", 32, 64, 32)
    x, r = _inputs("int8", 64, 32, 64, g)
    strided = dataclasses.replace(first, node=dataclasses.replace(first.node, stride=2))
    with pytest.raises(ValueError, match="1×1 stride-1"):
        pair.run(strided, second, x, r, CFG)
    with_res = dataclasses.replace(second, node=dataclasses.replace(second.node, residual="r"))
    with pytest.raises(ValueError, match="no residual"):
        pair.run(first, with_res, x, r, CFG)
    with pytest.raises(ValueError, match="8-bit input"):
        pair.run(first, dataclasses.replace(second, in_fmt="fp16"), x, r, CFG)
    with pytest.raises(ValueError, match="takes a residual"):
        pair.run(first, second, x, None, CFG)
    with pytest.raises(ValueError, match="cannot run"):
        pair.run(
            first, second, x, r, PairConfig(1024, 4, 2)
        )  # 1024 rows × 96 columns: far past the registers


def test_the_offered_tiles_fit_layer1_only_and_fp8_gets_the_late_tma_store():
    """ResNet-50's layer1 pairs (K1 64, N1 256) fit one TMA box; layer2's N1 = 512 does not."""
    assert {c.t_store for c in pair.pair_configs(64, 256, 64, "fp8")} == {1}  # the one store right in fp8
    assert "pair 64 w4 s3 x2 tma-late" in [c.label for c in pair.pair_configs(64, 256, 64, "fp8")]
    # two 64-row programs an SM with 3 stages fit beside N2 = 64, not beside N2 = 128 (shared memory)
    assert not any(c.per_sm == 2 and c.num_stages == 3 for c in pair.pair_configs(64, 256, 128, "int8"))
    assert [c.t_store for c in pair.pair_configs(64, 256, 128, "int8")] == [2, 0, 2]
    assert pair.pair_configs(128, 512, 128, "int8") == pair.pair_configs(128, 512, 128, "fp8") == []
    assert not PairConfig(128, 8, 3).fits(64, 256, 250)  # N2 not a multiple of 16


@pytest.mark.parametrize("qfmt,mma", [("int8", "s32.s8.s8"), ("fp8", "f32.e4m3.e4m3")])
def test_it_compiles_for_hopper_without_spills_and_with_tma_and_8bit_wgmma(qfmt, mma):
    """Ahead-of-time compile of each offered layer1 tile for sm_90 (no GPU): TMA copies, 8-bit wgmma, no spill."""
    ptr = {"int8": "*i8", "fp8": "*fp8e4nv"}[qfmt]
    sig = {a: ptr for a in ("x_ptr", "w1_ptr", "t_ptr", "res_ptr", "w2_ptr", "u_ptr")}
    sig.update(a1_ptr="*fp32", b1_ptr="*fp32", a2_ptr="*fp32", b2_ptr="*fp32", gamma="fp32", M="i32",
               NUM_PROGRAMS="i32")  # fmt: skip
    for cfg in pair.pair_configs(64, 256, 64, qfmt):
        out = int(qfmt == "fp8")
        const = dict(K1=64, N1=256, N2=64, RELU1=True, HAS_RES=True, OUT1=out, RELU2=True, OUT2=out,
                     ACC_INT=qfmt == "int8", BM=cfg.bm, T_STORE=cfg.t_store, PDL=False)  # fmt: skip
        aligned = tuple(k for k in sig if k.endswith("_ptr"))
        compiled = compile_sm90(pair.pair_kernel, sig, const, aligned, num_warps=cfg.num_warps,
                                num_stages=cfg.num_stages, enable_fp_fusion=False)  # fmt: skip
        ptx = compiled.asm["ptx"]
        assert "wgmma.mma_async.sync.aligned" in ptx and mma in ptx
        assert "cp.async.bulk.tensor.2d.shared::c" in ptx  # TMA loads
        assert ptxas_usage(compiled)["spill_stores"] == 0, cfg.label


def test_resnet50_offers_the_three_layer1_boundaries(r50_net):
    assert pair_choice.eligible(r50_net) == [
        ("layer1.0.conv3", "layer1.1.conv1"),
        ("layer1.1.conv3", "layer1.2.conv1"),
        ("layer1.2.conv3", "layer2.0.conv1"),
    ]
    fp16 = dataclasses.replace(r50_net, convs={**r50_net.convs})
    fp16.convs["layer1.1.conv1"] = dataclasses.replace(fp16.convs["layer1.1.conv1"], mode="fp16")
    assert ("layer1.0.conv3", "layer1.1.conv1") not in pair_choice.eligible(fp16)


def test_a_pair_is_kept_only_where_it_beats_its_two_layers_and_the_network_runs_it(r50_net):
    """With the two layers' times set huge the pair is kept, set to zero it is not; the kept pair's forward
    equals the network's without it, bit for bit (int8), through the interpreter."""
    from deepgap.measure.quant.tiles import LayerTiming

    net = dataclasses.replace(r50_net, pairs={}, backend={n: "triton" for n in r50_net.convs})
    net.backend = {n: ("triton" if n.startswith("layer1") else "reference") for n in net.convs}
    net.stem_backend = "torch"
    slow = [LayerTiming(n, 0, q_s=1e9) for n in ("layer1.0.conv3", "layer1.1.conv1")]
    rows = pair_choice.choose_pairs(net, 1, slow, reps=1)
    assert [r["first"] for r in rows] == ["layer1.0.conv3"]  # only pairs with both layers timed
    assert rows[0]["kept"] is not None and rows[0]["pair_s"] > 0
    assert set(net.pairs) == {"layer1.0.conv3"} and net.pairs["layer1.0.conv3"][0] == "layer1.1.conv1"
    pair_choice.label_layers(slow, rows)  # the per-layer table's tile text names the pair; times stay alone
    assert "runs fused with layer1.1.conv1" in slow[0].config and "layer1.0.conv3's pair" in slow[1].config
    assert slow[0].q_s == 1e9
    x = torch.randn(1, 3, 32, 32)
    names = [name for name, _ in net.steps(1)]
    assert "layer1.0.conv3" in names and "layer1.1.conv1" not in names  # the second runs in the first's step
    with torch.inference_mode():
        fused = net.forward(x)
        plain = dataclasses.replace(net, pairs={}).forward(x)
    assert torch.equal(fused, plain)
    fast = [LayerTiming(n, 0, q_s=0.0) for n in ("layer1.0.conv3", "layer1.1.conv1")]
    net.pairs = {}
    assert pair_choice.choose_pairs(net, 1, fast, reps=1)[0]["kept"] is None and net.pairs == {}


def test_the_switch_takes_on_or_off_and_names_both_otherwise(monkeypatch):
    monkeypatch.delenv(pair_choice.ENV, raising=False)
    assert pair_choice.pairs_offered()
    monkeypatch.setenv(pair_choice.ENV, "off")
    assert not pair_choice.pairs_offered()
    monkeypatch.setenv(pair_choice.ENV, "maybe")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_PAIRS"):
        pair_choice.pairs_offered()
