"""Tile candidates, activation formats and the per-layer choice of the quant engine (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchvision import models

from deepgap.measure.quant.fold import ConvertNode, ConvNode, resnet_graph
from deepgap.measure.quant.tiles import (
    SMEM_BUDGET_BYTES,
    LayerTiming,
    TileConfig,
    assign_formats,
    candidate_configs,
    choose_modes,
    stem_and_pool,
)


@pytest.fixture(scope="module")
def r50():
    return resnet_graph(models.resnet50().eval())


@pytest.mark.parametrize(
    "m,n,c",
    [
        (802816, 64, 64),
        (802816, 256, 64),
        (200704, 128, 128),
        (50176, 1024, 256),
        (12544, 2048, 512),
        (1568, 512, 512),
        (49, 2048, 512),
        (300, 48, 32),
    ],
)
@pytest.mark.parametrize("has_res", [False, True])
def test_candidates_satisfy_the_kernel_constraints(m, n, c, has_res):
    cfgs = candidate_configs(m, n, c, "int8", has_res)
    assert len(set(cfgs)) == len(cfgs)
    plain = [cfg for cfg in cfgs if not cfg.early_res]
    single = [cfg for cfg in plain if cfg.num_stages == 1]
    assert 1 <= len(plain) - len(single) <= 3
    assert bool(single) == (c in (64, 128) and n % 64 == 0)  # one K step: single-stage tiles timed too
    # a residual layer times each tile again with the residual loaded before the K loop; others never
    assert [cfg for cfg in cfgs if cfg.early_res] == (
        [dataclasses.replace(p, early_res=True) for p in plain] if has_res else []
    )
    for cfg in cfgs:
        assert n % cfg.bn == 0 and c % cfg.bk == 0 and cfg.smem_bytes() <= SMEM_BUDGET_BYTES
        if has_res:  # residual epilogues spill past 64 accumulators per thread (sm_90 compile)
            assert cfg.bm * cfg.bn // (32 * cfg.num_warps) <= 64


def test_small_grids_get_small_tiles():
    big = candidate_configs(802816, 256, 64)
    small = candidate_configs(49, 2048, 512)
    assert big[0].bm == 128 and big[0].bn == 256
    assert small[0].bm == 64  # 1 image of layer4: 128-row tiles would leave most SMs idle


def test_tile_label_and_fit():
    cfg = TileConfig(128, 256, 128, 8, 8, 3)
    assert cfg.label == "128x256x128 w8 s3" and cfg.smem_bytes() == 3 * 384 * 128
    assert not cfg.fits(n=128, c=128) and cfg.fits(n=256, c=256)


def test_all_quantized_formats(r50):
    g2, fmts = assign_formats(r50, {}, "int8")
    assert fmts["x"] == "fp16" and fmts["stem"] == "fp16"  # stem conv output feeds the max-pool in fp16
    assert fmts["pool"] == "int8" and fmts["layer1.0.downsample"] == "int8"  # residual-only → quantized
    assert fmts["layer4.2"] == "fp16"  # read by the head
    assert not any(isinstance(n, ConvertNode) for n in g2.nodes)


def test_fp16_layer_changes_its_neighbours_formats(r50):
    g2, fmts = assign_formats(r50, {"layer3.1.conv2": "fp16"}, "fp8")
    assert fmts["layer3.1.conv1"] == "fp16"  # its input is written in fp16 by the producer's epilogue
    assert fmts["layer3.1.conv2"] == "fp8"  # its output is quantized by its own epilogue
    assert not any(isinstance(n, ConvertNode) for n in g2.nodes)


def test_disagreeing_readers_get_a_conversion(r50):
    # pool feeds layer1.0.conv1 (fp16 here) and layer1.0.downsample (quantized)
    g2, fmts = assign_formats(r50, {"layer1.0.conv1": "fp16"}, "int8")
    conv = [n for n in g2.nodes if isinstance(n, ConvertNode)]
    assert len(conv) == 1 and conv[0].inp == "pool" and conv[0].fmt == "int8"
    assert fmts["pool"] == "fp16" and fmts[conv[0].out] == "int8"
    ds = next(n for n in g2.nodes if n.name == "layer1.0.downsample")
    c1 = next(n for n in g2.nodes if n.name == "layer1.0.conv1")
    assert ds.inp == conv[0].out and c1.inp == "pool"
    # the conversion comes before its reader, the original graph is untouched
    names = [n.name for n in g2.nodes]
    assert names.index(conv[0].name) < names.index("layer1.0.downsample")
    assert next(n for n in r50.nodes if n.name == "layer1.0.downsample").inp == "pool"


def test_stem_and_pool(r50):
    conv, pool = stem_and_pool(r50)
    assert conv.name == "conv1" and pool.inp == conv.out
    bad = type(r50)([r50.nodes[1], r50.nodes[0]] + r50.nodes[2:])
    with pytest.raises(ValueError, match="stem"):
        stem_and_pool(bad)


def test_choose_modes():
    ts = [
        LayerTiming("a", 1, q_s=1.0, fp16_s=2.0),
        LayerTiming("b", 1, q_s=2.0, fp16_s=1.0),
        LayerTiming("c", 1, q_s=1.01, fp16_s=1.0),  # within the 2% margin: quantized wins the tie
        LayerTiming("d", 1, q_s=None, fp16_s=1.0, q_error="compile failed"),
        LayerTiming("e", 1, q_s=1.0, fp16_s=None),
    ]
    modes = choose_modes(ts)
    assert modes == {"a": "q", "b": "fp16", "c": "q", "d": "fp16", "e": "q"}
    assert [t.mode for t in ts] == ["q", "fp16", "q", "fp16", "q"]
    assert ts[3].as_dict()["q_error"] == "compile failed"


def test_conv_nodes_of_other_widths_get_candidates():
    n = ConvNode("c", "a", "b", torch.zeros(96, 48, 1, 1), torch.zeros(96), 1, 0, True)
    cfgs = candidate_configs(1000, n.cout, n.cin)
    assert cfgs and all(96 % c.bn == 0 and 48 % c.bk == 0 for c in cfgs)
