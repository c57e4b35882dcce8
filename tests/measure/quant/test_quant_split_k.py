"""Split-K convolutions (`quant.split_k`, `kernels.conv_gemm_kernel`'s ``SPLIT``) in the Triton interpreter.

int8 sums are exact in any order, so a split tile must equal the unsplit one and the reference bit for bit;
fp8's partial sums add in another order than one K loop's (fp32 rounding may differ on the GPU; the tuner
holds each tile to `tuning._agree`'s bound), so its output is checked against the reference's codes as the
unsplit tile's are, and must repeat exactly from call to call (the last program adds the partials in slice
order). The tile's counter must be back at zero after each call, or the
next call (a CUDA graph's replay) would never see its last ticket.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from fp8_codes import same_codes  # noqa: E402
from test_quant_kernels import _layer  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import kernels, layers, split_k, tiles  # noqa: E402
from deepgap.measure.quant.tiles import TileConfig  # noqa: E402

BASE = TileConfig(32, 32, 32, group_m=2, num_warps=4, num_stages=2)
CASES = [  # k, stride, pad, cin, cout, residual, split: K = k·k·cin in whole slices of BK = 32
    (3, 1, 1, 32, 64, False, 3),
    (3, 1, 1, 64, 32, True, 6),
    (1, 1, 0, 128, 32, True, 4),
    (3, 2, 1, 32, 32, False, 9),
]


def _run(qfmt, case, seed=0):
    k, s, p, cin, cout, has_res, split = case
    lay, g = _layer(qfmt, k, s, p, cin, cout, qfmt if has_res else None, qfmt, True, seed)
    nb, h, w = 2, 5, 7  # M = 70 or 24: a partial last row tile
    x = layers.quantize_act(torch.randn(nb * h * w, cin, generator=g) * 40, qfmt)
    oh, ow = lay.node.out_hw(h, w)
    res = layers.quantize_act(torch.randn(nb * oh * ow, cout, generator=g) * 40, qfmt) if has_res else None
    cfg = dataclasses.replace(BASE, split_k=split)

    def conv(c):
        return kernels.conv_gemm(
            x, (nb, h, w), lay.w_q, k, s, p, lay.alpha, lay.beta, qfmt, True, c, res, lay.gamma
        )

    return conv, cfg, layers.conv_reference(lay, x, (nb, h, w), res), lay


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[0]}s{c[1]}c{c[3]}res{int(c[5])}split{c[6]}")
def test_an_int8_split_tile_equals_the_whole_one_bit_for_bit(case):
    conv, cfg, ref, lay = _run("int8", case)
    assert cfg.label.endswith(f" split{case[6]}")
    first = conv(cfg)
    assert torch.equal(first, ref) and torch.equal(first, conv(BASE))
    assert torch.equal(conv(cfg), first)  # a second call: the counters were put back
    ((partials, counters),) = lay.w_q.__dict__["_deepgap_split_k"].values()
    assert partials.dtype == torch.int32 and not counters.any()


def test_two_tile_widths_of_one_split_keep_counters_of_their_own():
    """Session 27's GPU bug: a wide tile's counters (fewer tiles) were reused by a narrow tile of one split."""
    conv, cfg, ref, lay = _run("int8", CASES[0])  # N = 64: 2 tiles of 32 columns or 1 of 64 per row block
    wide = dataclasses.replace(cfg, bn=64)
    assert torch.equal(conv(wide), ref) and torch.equal(conv(cfg), ref)
    sizes = sorted(c.numel() for _, c in lay.w_q.__dict__["_deepgap_split_k"].values())
    m_tiles = -(-2 * 5 * 7 // BASE.bm)
    assert sizes == [2 * m_tiles + 1, 4 * m_tiles + 1]  # a ticket and a leave count a tile, and a wait flag


@pytest.mark.parametrize("case", CASES[:2], ids=["k3", "k3res"])
def test_an_fp8_split_tile_agrees_and_repeats_exactly(case):
    conv, cfg, ref, lay = _run("fp8", case, seed=1)
    first = conv(cfg)
    same_codes(first, ref, "fp8")  # the reference's codes but where the interpreter misrounds e4m3
    same_codes(conv(BASE), ref, "fp8")  # the unsplit tile, alike
    assert torch.equal(conv(cfg).view(torch.int8), first.view(torch.int8))
    ((partials, counters),) = lay.w_q.__dict__["_deepgap_split_k"].values()
    assert partials.dtype == torch.float32 and not counters.any()


def test_a_split_that_does_not_cut_k_in_whole_steps_is_refused():
    conv, cfg, _, _ = _run("int8", (3, 1, 1, 32, 64, False, 3))
    with pytest.raises(ValueError, match="whole slices"):
        conv(dataclasses.replace(cfg, split_k=4))  # K = 288 = 9 steps of 32
    with pytest.raises(ValueError, match="early residual"):
        conv(dataclasses.replace(cfg, early_res=True))


def test_split_configs_fill_the_idle_sms_and_only_there():
    base = [TileConfig(64, 128, 128, 8, 4, 4), TileConfig(64, 64, 128, 8, 4, 4, early_res=True),
            TileConfig(64, 64, 128, 8, 4, 4), TileConfig(128, 64, 128, 8, 4, 4)]  # fmt: skip
    # ResNet-50 layer4 conv2 at batch 1: 49 rows, 512 columns, K 4,608 = 36 steps of 128 on 132 SMs:
    # 8 tiles of 64×64 (16 would cut 36 unevenly: 12 is the largest that cuts it, 12 × 8 ≤ 132); beside the
    # largest, the largest at most its half (6) and its quarter (3); no 64×128 tile (none ever won)
    got = split_k.split_configs(base, 49, 512, 4608, 132)
    assert [(c.bn, c.split_k) for c in got] == [(64, 12), (64, 6), (64, 3)]
    assert all(c.bm == 64 and not c.early_res for c in got)
    # layer3 conv2 at batch 1: 196 rows, 256 columns, K 2,304 = 18 steps: 8 and 16 tiles
    # (16 tiles: 6, then 3; no split of at most 6 // 4 = 1)
    assert [(c.bn, c.split_k) for c in split_k.split_configs(base, 196, 256, 2304, 132)] == [(64, 6), (64, 3)]
    assert split_k.split_configs(base, 49 * 64, 512, 4608, 132) == []  # 392 tiles and more fill the SMs
    assert split_k.split_configs(base, 49, 512, 128, 132) == []  # one K step: nothing to split


def test_spread_tiles_come_beside_each_split_on_a_gpu_only(monkeypatch):
    monkeypatch.delenv("DEEPGAP_QUANT_SMALL_BATCH", raising=False)
    base = [TileConfig(64, 64, 128, 8, 4, 4)]
    plain = split_k.split_configs(base, 49, 512, 4608, 132)
    got = split_k.split_configs(base, 49, 512, 4608, 132, spread=True)
    assert [(c.split_k, c.spread) for c in got] == [(s, d) for s in (12, 6, 3) for d in (False, True)]
    assert [c for c in got if not c.spread] == plain
    assert got[1].label == "64x64x128 w4 s4 split12 spread"
    # the programs that sum a band: the largest power of 2 within the split, each BM / PARTS rows
    gpu = torch.device("cuda")
    assert [split_k.constexprs(c, gpu)["PARTS"] for c in got if c.spread] == [8, 4, 2]
    assert split_k.constexprs(got[0], gpu) == {"SPREAD": False, "PARTS": 1}
    assert split_k.constexprs(dataclasses.replace(BASE, spread=True), gpu)["SPREAD"] is False  # no split
    with pytest.raises(ValueError, match="spread split-K tile runs on a GPU only"):
        split_k.constexprs(got[1], torch.device("cpu"))  # Triton's interpreter runs one program at a time
    monkeypatch.setenv("DEEPGAP_QUANT_SMALL_BATCH", "split")  # the engine before spread tiles, for an A/B
    assert split_k.split_configs(base, 49, 512, 4608, 132, spread=True) == plain


def test_a_spread_wait_that_gave_up_is_a_fault_after_the_runs():
    """`split_k.faults` reads each layer's flag (the counters' last slot); the engine asks it after timing."""
    w, other = torch.zeros(4), torch.zeros(4)
    partials, cnt = split_k.scratch(w, 49, 512, 12, 8, acc_int=True)
    assert cnt.numel() == 17 and split_k.faults([other, w]) is None
    cnt[16] = 1  # what `spread_sum` sets where a wait outlasts whole_flow.LIMIT polls
    assert split_k.faults([other, w]).startswith("a split-K wait gave up (49×512 output, split 12)")


def test_split_k_is_offered_unless_switched_off(monkeypatch):
    monkeypatch.delenv("DEEPGAP_QUANT_SMALL_BATCH", raising=False)
    assert tiles.small_batch_offered()
    monkeypatch.setenv("DEEPGAP_QUANT_SMALL_BATCH", "off")
    assert not tiles.small_batch_offered()
    monkeypatch.setenv("DEEPGAP_QUANT_SMALL_BATCH", "yes")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_SMALL_BATCH"):
        tiles.small_batch_offered()
