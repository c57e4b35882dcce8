"""The serving path's normalisation (uint8 NHWC pixels → the engine's input) as one flat Triton kernel.

Why: `benchmarks/serve_gap.py` (session 47, one H100) timed torch's ``addcmul`` normaliser at 0.087 ms per batch
of 128 ResNet-50 images, 3.5% of the quant fp8 engine's 2.47 ms: it reads 19 MB of uint8 and writes 39 MB
of fp16, about 0.66 TB/s, because an elementwise op that mixes uint8, fp32 and fp16 and broadcasts a
per-channel scale takes TensorIterator's slow dynamic-casting path. That cost is paid per served batch and
not by the engine alone, so it held serve's capacity / engine near 0.95 (issue 47).

A channels_last batch stores pixel (n, c, h, w) at ``((n·H + h)·W + w)·3 + c``, which is where uint8 NHWC
stores it too: the normalisation is then elementwise over the flat storage, with the channel ``i mod 3``.
Each program handles ``BLOCK`` consecutive bytes; the three scales and shifts arrive as scalars (no loads).
The math is torch's: ``shift + u8 · scale`` in fp32, rounded once to the output dtype.
"""

# Triton convention: compile-time (constexpr) parameters in capitals.
# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.launch import INT32_LIMIT, check, launcher

BLOCK = 4096  # bytes a program: 32 per thread at 4 warps, loaded as 16-byte vectors
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# N stays specialised: Triton vectorises the masked loads and stores only where it knows N divides by 16
@triton.jit
def normalise_kernel(u8_ptr, out_ptr, N, s0, s1, s2, t0, t1, t2, BLOCK: tl.constexpr):
    """out[i] = t_c + u8[i] · s_c for c = i mod 3, over ``N`` flat elements, ``BLOCK`` a program."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    c = i % 3
    s = tl.where(c == 0, s0, tl.where(c == 1, s1, s2))
    t = tl.where(c == 0, t0, tl.where(c == 1, t1, t2))
    v = tl.load(u8_ptr + i, mask=ok, other=0).to(tl.float32)
    tl.store(out_ptr + i, (t + v * s).to(out_ptr.dtype.element_ty), mask=ok)


def fits(u8: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether `normalise` can write ``out`` (n, 3, H, W) from ``u8`` (n, H, W, 3) as flat storage."""
    return (
        u8.dtype == torch.uint8
        and u8.dim() == 4
        and u8.shape[3] == 3
        and u8.is_contiguous()
        and out.dtype in DTYPES
        and out.shape == (u8.shape[0], 3, u8.shape[1], u8.shape[2])
        and out.is_contiguous(memory_format=torch.channels_last)
        and out.device == u8.device
        and u8.numel() <= INT32_LIMIT
    )


def normalise(
    u8: torch.Tensor, out: torch.Tensor, scale: tuple[float, ...], shift: tuple[float, ...]
) -> None:
    """``out = shift + u8 · scale`` per channel, in place; ``out`` channels_last, ``u8`` contiguous NHWC.

    On a CPU tensor the Triton interpreter runs it (the tests); `fits` says which tensors it takes.
    """
    check(fits(u8, out), f"normalise needs uint8 NHWC and a channels_last (n, 3, H, W) output; got "
          f"{u8.dtype} {tuple(u8.shape)} → {out.dtype} {tuple(out.shape)}")  # fmt: skip
    check(len(scale) == 3 and len(shift) == 3, "normalise needs three scales and three shifts")
    n = u8.numel()
    if n == 0:
        return
    launcher(normalise_kernel, u8.device)[(triton.cdiv(n, BLOCK),)](
        u8, out, n, *map(float, scale), *map(float, shift), BLOCK=BLOCK, num_warps=4
    )
