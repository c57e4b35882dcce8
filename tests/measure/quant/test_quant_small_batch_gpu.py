"""The small-batch kernels on a GPU (skipped without CUDA): split-K convolutions.

Split-K: the tiles `split_k.split_configs` offers at batch 1, spread ones (`split_k.spread_sum`) included.
On the GPU the slices run at once on different SMs, so this is where the ticket's ordering (the partial tiles
stored before the acquire-release atomic, read back from L2) and spread's wait are really tested: every
element against the exact reference, repeated calls, CUDA-graph replays that must each find the counters at
zero, and a spread tile's codes equal to its split's. (Two tile widths of one split once shared
counters sized for the fewer tiles, session 27; `test_quant_split_k.py` keeps that from coming back.)
"""

from __future__ import annotations

import pytest
import torch
from test_quant_gpu import DEV, RESNET50_LAYERS, _compare, _layer, _poisoned_like

pytestmark = pytest.mark.gpu

LAYERS = [t for t in RESNET50_LAYERS if t[0] in ("layer3.1.conv2", "layer4.0.conv2", "layer4.2.conv3")]


@pytest.mark.parametrize("qfmt", ["int8", "fp8"])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda t: t[0])
def test_split_k_at_batch_1_matches_the_reference_and_replays(qfmt, layer):
    from deepgap.measure.quant import kernels, layers, split_k
    from deepgap.measure.quant.persistent import programs
    from deepgap.measure.quant.tiles import candidate_configs

    if qfmt == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability ≥ 8.9")
    _, k, s, cin, cout, has_res, h = layer
    lay = _layer(qfmt, k, s, cin, cout, qfmt if has_res else None, qfmt, seed=5)
    oh = (h + 2 * (k // 2) - k) // s + 1
    g = torch.Generator(device=DEV).manual_seed(5)
    x = layers.quantize_act(torch.randn(h * h, cin, device=DEV, generator=g).relu() * 20, qfmt)
    res = (
        layers.quantize_act(torch.randn(oh * oh, cout, device=DEV, generator=g) * 20, qfmt)
        if has_res
        else None
    )
    ref = layers.conv_reference(lay, x, (1, h, h), res)
    base = candidate_configs(oh * oh, cout, cin, qfmt, has_res)
    cfgs = split_k.split_configs(base, oh * oh, cout, k * k * cin, programs(torch.device(DEV)), spread=True)
    assert cfgs and any(c.spread for c in cfgs), "batch 1 leaves most SMs idle: split-K tiles are offered"
    by_split = {}

    def run(cfg, out):
        return kernels.conv_gemm(
            x, (1, h, h), lay.w_q, k, s, k // 2, lay.alpha, lay.beta, qfmt, True, cfg, res, lay.gamma, out=out
        )

    for cfg in cfgs:
        out = run(cfg, _poisoned_like(ref))
        torch.cuda.synchronize()
        _compare(out, ref, qfmt)
        again = run(cfg, _poisoned_like(ref))
        assert torch.equal(again.view(torch.int8), out.view(torch.int8)), cfg.label  # slice order: repeatable
        graph_out = _poisoned_like(ref)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(cfg, graph_out)
        for _ in range(3):
            graph_out.copy_(_poisoned_like(ref))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(graph_out.view(torch.int8), out.view(torch.int8)), cfg.label
        for _, counters in lay.w_q.__dict__["_deepgap_split_k"].values():
            assert not counters.any(), "a tile's counter (or spread's wait flag) was not put back to zero"
        # a spread tile sums each band in slice order, as the last program does: the same codes
        first = by_split.setdefault((cfg.bn, cfg.split_k), out)
        assert torch.equal(first.view(torch.int8), out.view(torch.int8)), cfg.label
