"""The one-row GEMV's 8-bit codes made fp32 by integer operations on their 32-bit words, not by conversions.

Why: a batch-1 GEMV reads its weights at HBM's rate, about 18 codes a clock an SM on an H200 (4.8 TB/s over
132 SMs at 1.98 GHz), and turns each into an fp32 before its multiply-add. Triton converts an fp8 code with
``cvt.rn.f16x2.e4m3x2`` and then ``cvt.f32.f16``, an int8 code with an ``I2F``: conversion instructions,
which Hopper issues at a fraction of its integer and fp32 rate (the CUDA guide's throughput table: 16 a clock
an SM for most conversions). If the conversions bind, the GEMV runs below HBM's rate however its loads are
arranged; `benchmarks/gemv_ceiling.py` times a GEMV tile with its arithmetic taken away in steps.

Here a program loads its codes as int32 words, four codes a word, and makes each code's fp32 with shifts, masks
and one add, on the integer and fp32 pipes:

- **fp8 e4m3**: its sign to bit 31, its 7 exponent and mantissa bits to bits 20-26: an fp32 equal to the code
  × 2⁻¹²⁰, exact for every code, subnormal ones too (e4m3's bias is 7, fp32's 127). x is taken × 2¹⁰⁰ so that
  no product is subnormal; the sum is taken × 2²⁰ back. Powers of two: every rounding is the one of ``w · x``.
- **int8**: ``(b ^ 0x80) | 0x4B000000`` is the fp32 2²³ + 128 + b (b as a signed byte), exactly; less
  2²³ + 128 it is b.

The products are the plain GEMV's; only the order of the sum differs (each word's four products first), as it
differs between any two tiles. `mac` is `gemv.mac` for a tile with ``GemvTile.bits``.
"""

# ruff: noqa: N803 - Triton's capitals

from __future__ import annotations

import triton
import triton.language as tl

from deepgap.measure.quant import gemv

_UP = tl.constexpr(2.0**100)  # x's factor for fp8 codes, so that no code × x is subnormal (|x| < 2.6e8)
_BACK = tl.constexpr(2.0**20)  # 2**-120 (the code's) × 2**100 (x's) undone on the sum


@triton.jit
def code(w, i: tl.constexpr, INT8: tl.constexpr):
    """Byte ``i`` of each int32 word ``w`` as an fp32: the int8 code, or the fp8 code × 2⁻¹²⁰ (module docstring)."""
    b = (w >> (8 * i)) & 0xFF
    if INT8:
        return ((b ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
    return (((b & 0x80) << 24) | ((b & 0x7F) << 20)).to(tl.float32, bitcast=True)


@triton.jit
def mac(acc, w, x, INT8: tl.constexpr):
    """``acc + Σ_k w[:, k] · x[k]`` for a BN × BK/4 block of words ``w`` and BK fp32 values ``x`` (BN sums)."""
    if not INT8:
        x = x * _UP
    even, odd = tl.split(tl.reshape(x, (x.shape[0] // 4, 2, 2)))  # x[4j + 2a], x[4j + 2a + 1]
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    prod = code(w, 0, INT8) * x0[None, :] + code(w, 1, INT8) * x1[None, :]
    prod += code(w, 2, INT8) * x2[None, :] + code(w, 3, INT8) * x3[None, :]
    total = tl.sum(prod, axis=1)
    if not INT8:
        total = total * _BACK
    return acc + total


@triton.jit
def either(acc, w, x, REDUCE: tl.constexpr, BITS: tl.constexpr, INT8: tl.constexpr):
    """`mac` on words of int8 (``INT8``) or fp8 codes with ``BITS``, else `gemv.mac` on the codes."""
    if BITS:  # noqa: SIM108 - a constexpr branch: Triton compiles one side
        acc = mac(acc, w, x, INT8)
    else:
        acc = gemv.mac(acc, w, x, REDUCE)
    return acc


@triton.jit
def words(w_ptr, rows, K, BK: tl.constexpr):
    """The int32 words of rows ``rows``' first BK codes: a BN × BK/4 block of pointers (K a multiple of 4)."""
    return w_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (K // 4) + tl.arange(0, BK // 4)[None, :]
