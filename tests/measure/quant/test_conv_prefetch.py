"""A convolution's weights asked of L2 before PDL's wait (`l2_prefetch.conv_on`, ``DEEPGAP_QUANT_PREFETCH``).

Here, on the CPU: the switch and where it applies, and the sm_90 code `kernels.conv_gemm_kernel` compiles to
(ahead of time, no GPU): one bulk prefetch a tile, before the wait, and none without the switch. The GPU side
(the same output with it and without) is in `test_quant_small_batch_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from sm90 import compile_sm90  # noqa: E402

from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.measure.quant import kernels, l2_prefetch  # noqa: E402

CUDA = torch.device("cuda")


@pytest.mark.parametrize("capability", [(9, 0), (8, 9)])
def test_only_when_set_under_pdl_on_hopper(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.delenv("DEEPGAP_QUANT_PREFETCH", raising=False)
    assert not l2_prefetch.conv_on(CUDA, True)  # off by default
    monkeypatch.setenv("DEEPGAP_QUANT_PREFETCH", "l2")
    assert l2_prefetch.conv_on(CUDA, True) == (capability >= (9, 0))  # the bulk prefetch is sm_90's
    assert not l2_prefetch.conv_on(CUDA, False)  # no wait to overlap
    assert not l2_prefetch.conv_on(torch.device("cpu"), True)  # the interpreter runs no inline asm
    monkeypatch.setenv("DEEPGAP_QUANT_PREFETCH", "on")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_PREFETCH"):
        l2_prefetch.conv_on(CUDA, True)


def _conv_ptx(prefetch: bool) -> str:
    """ResNet-50 layer4's 3×3 conv2 tile at batch 1 (fp8, split 3, PDL) in sm_90 PTX."""
    ptrs = ("x_ptr", "w_ptr", "out_ptr", "alpha_ptr", "beta_ptr", "res_ptr")
    sig = dict.fromkeys(ptrs, "*fp8e4nv") | {"alpha_ptr": "*fp32", "beta_ptr": "*fp32", "gamma": "fp32"}
    sig |= dict.fromkeys(("M", "N", "C", "H", "W", "OH", "OW"), "i32") | {
        "ws_ptr": "*fp32",
        "cnt_ptr": "*i32",
    }
    const = dict(KH=3, KW=3, STRIDE=1, PAD=1, RELU=True, HAS_RES=False, OUT_KIND=1, ACC_INT=False, BM=64,
                 BN=64, BK=128, GROUP_M=8, EARLY_RES=False, SPLIT=3, PDL=True, PREFETCH=prefetch)  # fmt: skip
    aligned = ("x_ptr", "w_ptr", "out_ptr", "N", "C")
    return compile_sm90(kernels.conv_gemm_kernel, sig, const, aligned, num_warps=4, num_stages=8).asm["ptx"]


def test_each_tile_asks_for_its_band_once_before_the_wait():
    ptx = _conv_ptx(True)
    issued = [i for i in range(len(ptx)) if ptx.startswith("cp.async.bulk.prefetch.L2.global", i)]
    assert len(issued) == 1 and issued[0] < ptx.index("griddepcontrol.wait")
    assert "%tid.x; setp.eq.u32" in ptx  # one thread a program asks
    assert "cp.async.bulk.prefetch" not in _conv_ptx(False)
