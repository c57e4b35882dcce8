"""The fused fp8 Linear's persistent TMA GEMM core (issue 50) on the CPU: the tile walk, the choice, sm_90 code.

The Triton interpreter runs `linear_kernels.fp8_linear_persistent_kernel` as written (device-side
descriptors, the persistent walk); tests/measure/quant/test_quant_linear.py holds both GEMM cores to the fp32 reference,
and here the persistent one must equal the grouped one bit for bit (same epilogue, same arithmetic in the
interpreter) over any grid. tests/measure/quant/test_quant_linear_persistent_gpu.py holds it to cuBLASLt on a GPU.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.measure.models.build import build_model  # noqa: E402
from deepgap.measure.quant.fused_mlp import fuse_mlp  # noqa: E402
from deepgap.measure.quant.linear_kernels import (  # noqa: E402
    FP8_LINEAR_PERSISTENT_TILE,
    Epilogue,
    fp8_linear,
    fp8_linear_persistent_kernel,
    tuned_tiles,
)
from deepgap.measure.quant.tiles import TileConfig, linear_persistent_configs  # noqa: E402
from deepgap.measure.quant.transformer import calibrate_linears, quantize_linears  # noqa: E402
from deepgap.measure.quant.transformer_engine import DEFAULT_HOW  # noqa: E402

GROUPED = TileConfig(32, 32, 32, 2, 4, 2)
PERSISTENT = dataclasses.replace(GROUPED, persistent=1)


def _operands(rows: int, k: int, n: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(rows, k, generator=g) * 20).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 20).to(torch.float8_e4m3fn)
    return a, w, torch.randn(n, generator=g)


@pytest.mark.parametrize("programs", [1, 5, 64])
@pytest.mark.parametrize(
    "tma_epi,split,gelu,out_scale",
    [
        (False, False, True, 0.05),
        (True, False, True, 0.05),
        (True, True, False, None),
        (False, True, True, 0.05),
    ],
    ids=["", "te", "te-split-bf16", "split"],
)
def test_the_walk_writes_every_tile_as_the_grouped_kernel_does(programs, tma_epi, split, gelu, out_scale):
    """12 tiles (3 row tiles, the last partial, × 4 column tiles) over 1, 5 or 64 (> tiles) programs.

    ``split``: each tile's epilogue in two 16-column halves; a half stored in the other's place shows here.
    """
    a, w, bias = _operands(70, 64, 128, seed=programs)
    epi = Epilogue(1e-3, bias, gelu, out_scale)
    want = fp8_linear(a, w, epi, GROUPED)
    tile = dataclasses.replace(PERSISTENT, tma_epilogue=tma_epi, split_epilogue=split)
    got = fp8_linear(a, w, epi, tile, num_programs=programs)
    assert got.dtype == want.dtype and torch.equal(got.float(), want.float())


@pytest.fixture(scope="module")
def tinybert_fp8():
    model = build_model("tinybert", 16)
    quantize_linears(model, DEFAULT_HOW["fp8"], calibrate_linears(model, [torch.randint(0, 1000, (8, 16))]))
    return model


def test_fused_mlp_on_the_persistent_core_equals_the_grouped_one(tinybert_fp8):
    """tinybert's MLP chains fused with either core: the same codes reach ff2, the same output comes out."""
    grouped, persistent = copy.deepcopy(tinybert_fp8), copy.deepcopy(tinybert_fp8)
    assert fuse_mlp(grouped, GROUPED) == fuse_mlp(persistent, PERSISTENT) == 2
    assert persistent.layers[0].ff1.tile == PERSISTENT.fit(32, 64).fields()
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert torch.equal(persistent(ids), grouped(ids))


def test_a_tuned_chain_takes_the_grouped_tile_untimed_off_the_gpu(tinybert_fp8):
    """``tile="tuned"``: the op times both cores' tiles on a GPU (the GPU tests); on the CPU it takes
    `FP8_LINEAR_TILE` fitted, untimed: no tile is recorded as timed."""
    tuned, default = copy.deepcopy(tinybert_fp8), copy.deepcopy(tinybert_fp8)
    assert fuse_mlp(tuned, "tuned") == fuse_mlp(default) == 2 and tuned.layers[0].ff1.tile == []
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        assert torch.equal(tuned(ids), default(ids))
    assert tuned_tiles() == {}


def test_the_tiles_offered_fit_bert_and_vit_and_travel_through_the_custom_op():
    for k, n in [(768, 2304), (768, 768), (768, 3072), (3072, 768), (1024, 4096)]:
        tiles = linear_persistent_configs(k, n)
        assert len(tiles) >= 5 and all(t.persistent and k % t.bk == 0 and n % t.bn == 0 for t in tiles)
        assert tiles[0] == FP8_LINEAR_PERSISTENT_TILE and any(t.tma_epilogue for t in tiles)
        assert any(t.persistent == 2 for t in tiles)  # issue 47's two programs per SM
    assert linear_persistent_configs(64, 96)[0].label == "128x32x64 w8 s3 persistent"  # fitted to K and N
    for t in linear_persistent_configs(768, 3072):
        assert TileConfig.from_fields(t.fields()) == t
    assert TileConfig.from_fields([128, 256, 128, 8, 8, 3]) == TileConfig(128, 256, 128, 8, 8, 3)


def test_what_it_cannot_take_is_a_clear_error():
    a, w, bias = _operands(16, 64, 32)
    odd = torch.empty(16 * 64 + 8, dtype=torch.float8_e4m3fn)[8:].view(16, 64)  # 8 bytes in: no descriptor
    odd.copy_(a)
    with pytest.raises(ValueError, match="16-byte boundary"):
        fp8_linear(odd, w, Epilogue(1.0, bias), PERSISTENT)
    with pytest.raises(ValueError, match="BK"):
        fp8_linear(a[:, :48].contiguous(), w[:, :48].contiguous(), Epilogue(1.0, bias), PERSISTENT)


@pytest.mark.parametrize("out_fp8,tma_epi", [(True, True), (False, False)])
def test_it_compiles_to_tma_copies_and_fp8_wgmma_for_hopper(out_fp8, tma_epi):
    """Ahead-of-time compile for sm_90 (no GPU): bert-base's ff1 (ff2's epilogue) at the default tile.

    Its epilogue in halves: whole, with GELU, ptxas gives this tile all 255 registers and spills (not
    asserted here: ptxas is not run).
    """
    t = FP8_LINEAR_PERSISTENT_TILE
    sig = dict(a_ptr="*fp8e4nv", w_ptr="*fp8e4nv", bias_ptr="*fp32", out_ptr="*fp8e4nv" if out_fp8 else "*bf16",
               scale="fp32", out_inv_scale="fp32", M="i32", N="i32")  # fmt: skip
    const = dict(K=768, GELU=out_fp8, OUT_FP8=out_fp8, BM=t.bm, BN=t.bn, BK=t.bk, GROUP_M=t.group_m, NUM_SMS=132,
                 TMA_EPILOGUE=tma_epi, EPI_N=t.bn // 2)  # fmt: skip
    compiled = compile_sm90(
        fp8_linear_persistent_kernel, sig, const, ("a_ptr", "w_ptr", "bias_ptr", "out_ptr", "N"),
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async.sync.aligned" in ptx and "f32.e4m3.e4m3" in ptx
    assert "cp.async.bulk.tensor.2d.shared::c" in ptx and "tensormap" in ptx  # TMA loads, device descriptors
    assert ("cp.async.bulk.tensor.2d.global.shared" in ptx) == tma_epi  # the output's TMA store
    assert compiled.metadata.shared <= 227 * 1024
