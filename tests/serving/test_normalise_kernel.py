"""Serve's normaliser as one flat Triton kernel (`deepgap.serving.worker.normalise_kernel`), checked against
torch's ``addcmul`` path through the Triton interpreter on the CPU, and on a GPU where one is present."""

from __future__ import annotations

import pytest
import torch

from deepgap.serving.worker import normalise_kernel
from deepgap.serving.worker.ring import InputRing, Normaliser


def _out(n: int, res: int, dtype, device="cpu") -> torch.Tensor:
    return torch.full((n, 3, res, res), -7.0, dtype=dtype, device=device).contiguous(
        memory_format=torch.channels_last
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_kernel_writes_what_torchs_path_writes_and_nothing_past_the_batch(dtype):
    ring = InputRing(5, 37, seed=2)  # 5 · 37 · 37 · 3 = 20,535 bytes: several programs, the last one partial
    u8 = ring.images[:4]
    want, got = _out(5, 37, dtype), _out(5, 37, dtype)
    Normaliser(dtype, "cpu", backend="torch")(u8, want)
    assert Normaliser(dtype, "cpu", backend="triton")(u8, got).shape == (4, 3, 37, 37)
    # fp16: equal. fp32: an FMA may part the two paths by an ulp. bf16: the Triton interpreter truncates to
    # bf16 where a GPU rounds to nearest (the GPU test below checks that), so here within one bf16 ulp
    tol = {torch.float16: (0, 0), torch.float32: (2e-7, 1e-6), torch.bfloat16: (2**-7, 0)}[dtype]
    torch.testing.assert_close(got[:4], want[:4], rtol=tol[0], atol=tol[1])
    assert bool((got[4] == -7.0).all()), "the kernel wrote past the batch"
    ref = Normaliser(dtype, "cpu").reference(u8)
    torch.testing.assert_close(got[:4].float(), ref, rtol=1e-2, atol=1e-2)


def test_auto_takes_torch_on_the_cpu_and_where_the_layout_does_not_fit():
    u8 = InputRing(2, 8, seed=1).images
    norm = Normaliser(torch.float16, "cpu")
    nchw = torch.empty(2, 3, 8, 8, dtype=torch.float16)  # contiguous NCHW: not the kernel's flat layout
    assert not normalise_kernel.fits(u8, nchw)
    assert normalise_kernel.fits(u8, _out(2, 8, torch.float16))
    norm(u8, nchw)
    torch.testing.assert_close(nchw.float(), norm.reference(u8), rtol=2e-3, atol=6e-3)
    with pytest.raises(ValueError, match="channels_last"):
        Normaliser(torch.float16, "cpu", backend="triton")(u8, nchw)
    with pytest.raises(ValueError, match="backend must be"):
        Normaliser(torch.float16, "cpu", backend="fast")
    assert not normalise_kernel.fits(u8.float(), _out(2, 8, torch.float16))  # uint8 pixels only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_on_a_gpu_auto_runs_the_kernel_and_agrees_with_torch(dtype, monkeypatch):
    u8 = InputRing(130, 224, seed=3).images[:128].cuda()
    want, got = _out(128, 224, dtype, "cuda"), _out(128, 224, dtype, "cuda")
    Normaliser(dtype, "cuda", backend="torch")(u8, want)
    calls = []
    real = normalise_kernel.normalise
    monkeypatch.setattr(normalise_kernel, "normalise", lambda *a: calls.append(1) or real(*a))
    Normaliser(dtype, "cuda")(u8, got)
    torch.cuda.synchronize()
    assert calls == [1]
    exact = dtype != torch.float32  # one rounding from fp32 on both paths (bf16 too, to nearest on a GPU)
    torch.testing.assert_close(got, want, rtol=0 if exact else 2e-7, atol=0 if exact else 1e-6)
