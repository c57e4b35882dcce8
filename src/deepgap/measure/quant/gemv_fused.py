"""The one-row GEMV with the decode layer's neighbours folded in: RMSNorm before, SwiGLU or the residual after.

Why: at batch 1 a Llama layer's step is four weight-only GEMVs (`deepgap.measure.quant.gemv`) and, between
them, small kernels that read and write a 4096-wide row: the two RMSNorms, the two residual adds and SiLU ×
up. On one H200 (session 18) those took 0.40 of 3.25 ms per token at 1.5–3 µs each, launches rather than
bytes. Each folds into the GEMV that reads or writes the same row:

- **RMSNorm** (``gamma``): ``norm(x) · Wᵀ = rsqrt(mean(x²) + eps) · (x ⊙ γ) · Wᵀ``. The scalar factors out,
  so the program that walks K for its band of outputs sums ``x²`` on the way (every program reads all of x
  anyway) and multiplies its sums by the root at the end: no pass of its own, no normalized row written.
- **SwiGLU** (``swiglu``): the fused ``gate_up`` weight holds the gate's ``N/2`` rows, then the up's; a program
  takes output channel ``n``'s two rows (``n`` and ``n + N/2``) and writes ``silu(gate) · up``, ``N/2`` wide.
- **Residual** (``residual``): ``out = residual + x · Wᵀ`` (the o and down projections' add).

Arithmetic is fp32 from the loads to the store (HF rounds the normalized row and each projection to bf16 in
between; the differences are bf16 roundings, `reference` is held to the same fp32 order). The tile is timed
per (variant, K, N) as the plain GEMV's (`gemv.fastest`). On CPU tensors the kernel runs in Triton's
interpreter (`deepgap.measure.quant.launch`), as the tests do.
"""

# ruff: noqa: N803

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from deepgap.measure.quant import gemv
from deepgap.measure.quant.launch import check, launcher

# the plain row kernel's candidates without the prefetch (two weight bands in flight already for SwiGLU)
FUSED_TILES = tuple(t for t in gemv.ROW_TILES if not t.prefetch)


@triton.jit
def _fused_step(
    acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk,
    NORM: tl.constexpr, SWIGLU: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """One K step of `fused_row_kernel` on weights already loaded: x's slice, its squares, the products."""
    x = tl.load(x_ptr + k + rk).to(tl.float32)
    if NORM:
        squares += x * x
        x = x * tl.load(gamma_ptr + k + rk).to(tl.float32)
    acc = gemv.mac(acc, w, x, REDUCE)
    if SWIGLU:  # the up projection's row of the same channel, N/2 rows further
        acc_up = gemv.mac(acc_up, w_up, x, REDUCE)
    return acc, acc_up, squares


@triton.jit
def fused_row_kernel(
    x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps,
    NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    REDUCE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """``out[band]`` of one row: an optional RMSNorm of x, the product, then SwiGLU or a residual add.

    With ``PDL`` the first K step's weights are read before the wait for the previous kernel, as in
    `gemv.fp8_gemv_row_kernel`.
    """
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]
    # `gemv.mac`: BN sums, or a BN × BK block reduced at the end
    acc = tl.zeros((BN,), dtype=tl.float32) if REDUCE else tl.zeros((BN, BK), dtype=tl.float32)
    acc_up = acc
    squares = tl.zeros((BK,), dtype=tl.float32)
    # the weights do not depend on the previous kernel: with PDL the first step's are in flight before the wait
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        w = tl.load(w_ptrs)
        w_up = w
        if SWIGLU:
            w_up = tl.load(w_ptrs + NO * K)
        tl.extra.cuda.gdc_wait()
        acc, acc_up, squares = _fused_step(
            acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, 0, rk, NORM, SWIGLU, REDUCE
        )
    for k in range(PDL * BK, K, BK):
        w = tl.load(w_ptrs + k)
        w_up = w
        if SWIGLU:
            w_up = tl.load(w_ptrs + NO * K + k)
        acc, acc_up, squares = _fused_step(
            acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk, NORM, SWIGLU, REDUCE
        )
    y = gemv.total(acc, REDUCE) * tl.load(scale_ptr + rn)
    root = 1.0
    if NORM:
        root = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
        y = y * root
    if SWIGLU:
        up = gemv.total(acc_up, REDUCE) * tl.load(scale_ptr + NO + rn) * root
        y = y * tl.sigmoid(y) * up
    if RESIDUAL:
        y += tl.load(res_ptr + rn).to(tl.float32)
    tl.store(out_ptr + rn, y.to(tl.bfloat16))


@dataclasses.dataclass(frozen=True)
class Fusion:
    """What one fused call folds in: a norm's scale and eps, SwiGLU, a residual row (module docstring)."""

    gamma: torch.Tensor | None = None
    eps: float = 0.0
    swiglu: bool = False
    residual: torch.Tensor | None = None

    def key(self) -> tuple:
        """The variant, for the tile's timing (the kernel's constexprs)."""
        return (self.gamma is not None, self.swiglu, self.residual is not None)


def fused_gemv(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    fusion: Fusion,
    tile: gemv.GemvTile | None = None,
) -> torch.Tensor:
    """One row ``x (1, K)`` bf16 through 8-bit ``codes (N, K)`` with per-channel ``scale (N,)``, as ``fusion`` says.

    Returns ``(1, N)`` bf16, or ``(1, N/2)`` with SwiGLU. ``gamma``: the norm's (K,) scale; ``residual``:
    ``(1, N)`` bf16, added after the product.
    """
    m, k = x.shape
    n = codes.shape[0]
    no = n // 2 if fusion.swiglu else n
    check(m == 1 and x.dtype == torch.bfloat16 and x.is_contiguous(), "x: one contiguous bf16 row")
    check(
        codes.dtype in gemv.CODES and codes.is_contiguous() and codes.shape[1] == k and k % 16 == 0,
        f"codes {tuple(codes.shape)}: contiguous (N, K) e4m3 or int8 for K={k}",
    )
    check(scale.shape == (n,) and scale.dtype == torch.float32, "scale: float32 of shape (N,)")
    check(no % 16 == 0, f"N={n}: the output width must be a multiple of 16 (of 32 with SwiGLU)")
    check(fusion.gamma is None or fusion.gamma.shape == (k,), f"gamma: the norm's scale of shape ({k},)")
    check(fusion.residual is None or fusion.residual.numel() == no, f"residual: one row of {no}")
    t = (tile or _tuned(x, codes, scale, fusion)).fit(k, no)
    out = torch.empty((1, no), dtype=torch.bfloat16, device=x.device)
    launcher(fused_row_kernel, x.device)[(no // t.bn,)](
        x, codes, scale,
        fusion.gamma if fusion.gamma is not None else scale,
        fusion.residual if fusion.residual is not None else x,
        out, no, k, fusion.eps,
        NORM=fusion.gamma is not None, SWIGLU=fusion.swiglu, RESIDUAL=fusion.residual is not None,
        BN=t.bn, BK=t.bk, REDUCE=t.reduce_each, num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out


def _tuned(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion) -> gemv.GemvTile:
    """The fastest of `FUSED_TILES` for this variant and shape (`gemv.fastest`)."""
    k, n = x.shape[1], codes.shape[0]
    no = n // 2 if fusion.swiglu else n
    return gemv.fastest(
        ("fused", fusion.key(), k, n, str(x.device)),
        x.device,
        (c.fit(k, no) for c in FUSED_TILES),
        lambda t: fused_gemv(x, codes, scale, fusion, t),
    )


def reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion) -> torch.Tensor:
    """The same arithmetic in fp32 torch: what the kernel is held to."""
    xf = x.float()
    root = 1.0
    if fusion.gamma is not None:
        root = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + fusion.eps)
        xf = xf * fusion.gamma.float()
    y = (xf @ (codes.float() * scale[:, None]).t()) * root
    if fusion.swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    if fusion.residual is not None:
        y = y + fusion.residual.float().reshape(y.shape)
    return y.to(torch.bfloat16)


@torch.library.custom_op("deepgap::fused_gemv", mutates_args=())
def fused_gemv_op(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    gamma: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    swiglu: bool,
) -> torch.Tensor:
    """`fused_gemv` as a custom op: torch.compile keeps it one call, a CUDA graph captures it."""
    return fused_gemv(x, codes, scale, Fusion(gamma, eps, swiglu, residual))


@fused_gemv_op.register_fake
def _(x, codes, scale, gamma, residual, eps, swiglu):
    return x.new_empty((1, codes.shape[0] // (2 if swiglu else 1)), dtype=torch.bfloat16)
