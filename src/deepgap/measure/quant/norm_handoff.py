"""The RMSNorm handed from the GEMV that writes a row to the GEMV that reads it, at batch 1.

Why: folded into the reading GEMV (`gemv_fused`, ``Fusion.gamma``), the norm has every program sum x² over the
whole row and scale x by γ on the way. On one H200 (session 38, ``benchmarks/fused_variants.py``) that took the
qkv and gate_up GEMVs from 8.96 and 29.89 µs to 10.26 and 36.45, 0.25 ms of an 8B model's 2.5 ms step: ptxas
keeps x, γ and the squares in registers, 178 a thread against 128, half the programs an SM. The row was written
one kernel earlier, by o's or down's residual add, whose programs hold their band of it in registers anyway.
So the writer hands the norm over:

- **the writer** (``Fusion.hand``, a `HandOff`) also stores its band times the next norm's γ, in bf16 (the row
  the reader multiplies), and its band's sum of squares, one fp32 a `GROUP` of channels (`hand_off`). These are
  plain stores, no atomics: nothing to zero between steps, and every run gives the same bits.
- **the reader** (``Fusion.handed``) walks the scaled row as a plain GEMV does, then reads the row's group sums
  (`handed_root`): ``rsqrt(Σ/K + eps)`` scales its outputs as the fold's own root did. At sm_90 its 4 × 4096
  tile compiles to the plain GEMV's 128 registers.

The squares are of the bf16 row the writer stores, as the fold's were of the row it read. The scaled row is
rounded to bf16 where the fold kept ``x · γ`` in fp32 (HF rounds the normalized row to bf16 too). Measured in
session 39 (the bare loop, 8B, batch 1, `deepgap.measure.llm_fused`'s ``DEEPGAP_DECODE_NORM``): one H200 fp8
392.9 → 410.2 tokens/s, int8 326.5 → 352.9; one H100 fp8 324.0 → 331.1.
"""

# ruff: noqa: N803

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.launch import check

GROUP = tl.constexpr(8)  # channels a writer's square sum covers: a writer's band is a multiple of it


@dataclasses.dataclass(frozen=True)
class HandOff:
    """What a writer hands the next norm's reader: that norm's γ, and the two buffers it writes.

    ``gamma``: ``(N,)`` bf16; ``scaled``: ``(1, N)`` bf16, the row ⊙ γ; ``squares``: ``(N / GROUP,)`` fp32.
    """

    gamma: torch.Tensor
    scaled: torch.Tensor
    squares: torch.Tensor

    def check(self, n: int, paired: bool) -> None:
        """A plain row's writer (``paired``: SwiGLU or RoPE, refused), buffers as wide as its row of ``n``."""
        check(not paired, "hand: a plain row's writer (no SwiGLU, no RoPE)")
        check(
            self.gamma.shape == (n,) and self.scaled.shape == (1, n),
            f"hand: γ ({n},) and a scaled row (1, {n})",
        )
        bf16 = self.scaled.dtype == torch.bfloat16 and self.scaled.is_contiguous()
        check(bf16, "hand: the scaled row, contiguous bf16")
        want = (squares_width(n),)
        check(
            self.squares.shape == want and self.squares.dtype == torch.float32,
            f"hand: squares fp32 of shape {want}",
        )

    @classmethod
    def to(cls, gamma: torch.Tensor) -> HandOff:
        """Fresh buffers for a row as wide as ``gamma``."""
        n = gamma.shape[0]
        scaled = torch.empty((1, n), dtype=torch.bfloat16, device=gamma.device)
        return cls(gamma, scaled, torch.empty(squares_width(n), dtype=torch.float32, device=gamma.device))


def squares_width(k: int) -> int:
    """The group sums a row of ``k`` channels hands over."""
    return k // GROUP.value


def check_handed(squares: torch.Tensor, k: int, gamma: torch.Tensor | None) -> None:
    """A reader's handed norm: the square sums of a row of ``k``, and no γ (x is the row ⊙ γ already)."""
    check(gamma is None, "handed: x is the row ⊙ γ already; pass no gamma")
    want = (squares_width(k),)
    check(squares.shape == want and squares.dtype == torch.float32, f"handed: fp32 of shape {want}")


def parts_block(k: int) -> int:
    """The reader's load of the group sums: a power of two ≥ `squares_width` (Triton's ranges are)."""
    return triton.next_power_of_2(max(squares_width(k), 1))


@triton.jit
def hand_off(y, band, gamma, scaled_ptr, squares_ptr, BN: tl.constexpr):
    """A writer's band ``y`` (fp32, BN channels from ``band``) handed over: the row ⊙ γ and its group sums.

    ``gamma``: the band's γ (`band_gamma`), loaded by the writer where it chooses (before PDL's wait: no kernel
    writes it). ``y`` is rounded to bf16 first: the squares and the product are of the row the writer stores.
    """
    rn = band + tl.arange(0, BN)
    yb = y.to(tl.bfloat16).to(tl.float32)
    tl.store(scaled_ptr + rn, (yb * gamma).to(tl.bfloat16))
    sums = tl.sum(tl.reshape(yb * yb, (BN // GROUP, GROUP)), axis=1)
    tl.store(squares_ptr + band // GROUP + tl.arange(0, BN // GROUP), sums)


@triton.jit
def band_gamma(band, gamma_ptr, BN: tl.constexpr):
    """The next norm's γ over a writer's band of BN channels from ``band``, in fp32 (`hand_off`)."""
    return tl.load(gamma_ptr + band + tl.arange(0, BN)).to(tl.float32)


@triton.jit
def handed_root(squares_ptr, K, eps, PARTS: tl.constexpr):
    """The reader's ``rsqrt(mean(x²) + eps)`` from the writer's group sums (K / GROUP of them, `parts_block`)."""
    i = tl.arange(0, PARTS)
    sums = tl.load(squares_ptr + i, mask=i < K // GROUP, other=0.0)
    return tl.rsqrt(tl.sum(sums, axis=0) / K + eps)


def reference(row: torch.Tensor, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a writer of bf16 ``row (1, N)`` hands over, in torch: the scaled row and the group sums."""
    r = row.float()
    scaled = (r * gamma.float()).to(torch.bfloat16)
    return scaled, r.pow(2).reshape(-1, GROUP.value).sum(-1)
