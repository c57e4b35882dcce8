"""An fp8 Linear whose epilogue applies the bias, GELU and the next layer's fp8 quantization (Triton).

Why: in bert-base fp8 at batch 256 (one H200, results/h200/session17) the first MLP GEMM writes its
output in bf16 and a second kernel reads it back for GELU and the fp8 quantization of the next GEMM's
input: 2.5 ms of 9.7 ms per batch, more than the GEMM itself. cuBLASLt has a GELU epilogue, but
``torch._scaled_mm`` does not expose it. Here one kernel computes ``q(gelu(s·(A·Wᵀ) + b) / s_out)``
and writes the fp8 codes the next GEMM reads. It is measured against cuBLASLt + Inductor's kernel by
``benchmarks/fp8_gemm_gelu.py`` before any engine uses it.

Two GEMM cores under one epilogue (`_epilogue`): ``fp8_linear_kernel``, a grouped tile per program with
pointer loads (measured on one H200 at about half cuBLASLt's rate), and ``fp8_linear_persistent_kernel``,
the Hopper form of issue 47's 1×1-convolution kernel (`quant.persistent`: its tile walk and TMA K loop are
shared helpers), chosen by a ``persistent`` `TileConfig`; `tuned` times both kinds of tile per shape.

``A`` is (M, K) e4m3 codes, ``W`` (N, K) e4m3 codes (a Linear's weight layout), ``s`` the product of
both per-tensor scales, ``b`` the bias (fp32, or bf16 as a `QuantLinear` keeps it). The GELU is the exact
(erf) form, as BERT and ViT specify, or on request (``approximate="tanh"``, torch's name) the tanh form
``0.5·y·(1 + tanh(0.7978845608·(y + 0.044715·y³)))``: on a GPU its tanh is one ``tanh.approx.f32`` (inline
PTX; neither Triton 3.6 nor 3.8 has a ``tl.math.tanh``, and libdevice's ``tanhf`` is a longer exact
routine), in the interpreter, which runs no inline PTX, ``2/(1 + e^(-2u)) - 1``. It differs from the exact
GELU by at most about 5e-4 (tests/measure/quant/test_quant_linear_epilogue.py), far below an e4m3 code's step (1/16 of
the value); the quant engine runs it by default since session 24 (`linear_choice.DEFAULT_GELU`, measured
faster at the same error), this function only when asked. ``approximate="erf-poly"`` keeps the exact GELU
but computes its erf branch-free (Abramowitz & Stegun 7.1.26: ``|error| ≤ 1.5e-7``, one exp and one
division per element; libdevice's ``erff`` branches on |x| and is about 39 PTX instructions an element in
this epilogue against about 8 for the tanh form), also a measured option. The tanh form is bound by the
special-function units: at bert-base's ff1 (session 24) it added 24.5 µs to a 146 µs call, about 15.6
elements a clock per SM against their 16. Its tanh on half-precision pairs (``tanh.approx.f16x2``) would not
help: compiled for sm_90 (Triton 3.6, nvdisasm) it is two ``MUFU.TANH.F16`` a pair, 128 a thread per
128×256 tile as with ``tanh.approx.f32``, plus the conversions (session 25; not offered).
On CPU tensors both kernels run in Triton's interpreter (`deepgap.measure.quant.launch`), device-side
TMA descriptors included, as the tests do.
"""

# ruff: noqa: N803, SIM108

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gemv import fastest
from deepgap.measure.quant.kernels import _grouped_tile
from deepgap.measure.quant.launch import check, launcher
from deepgap.measure.quant.persistent import check_tma, persistent_grid, tile_count, tile_product
from deepgap.measure.quant.tiles import TileConfig, linear_persistent_configs

FP8_MAX = 448.0
# the fastest of six on one H200 for bert-base's and ViT's first MLP GEMM (benchmarks/fp8_gemm_gelu.py)
FP8_LINEAR_TILE = TileConfig(bm=128, bn=256, bk=128, group_m=8, num_warps=8, num_stages=3)
# the same tile walked by the persistent TMA kernel, its epilogue in halves (no spills with GELU on sm_90):
# the first of `tiles.linear_persistent_configs`, untimed
FP8_LINEAR_PERSISTENT_TILE = TileConfig(128, 256, 128, 8, 8, 3, persistent=1, split_epilogue=True)
# the GELU's form, as torch names it ("none" is the exact one, with libdevice's erf), and the exact one with
# a branch-free erf
APPROXIMATE = ("none", "tanh", "erf-poly")
CUBLASLT = "cuBLASLt"  # `tuned`'s name for ``torch._scaled_mm`` (bias only, bf16 out) beside the tiles
# the kernels' GELU constexpr: off, exact, tanh through tanh.approx.f32 (GPU), tanh through exp (interpreter),
# exact with Abramowitz & Stegun's erf
GELU_OFF, GELU_ERF, GELU_TANH_PTX, GELU_TANH_EXP, GELU_ERF_POLY = 0, 1, 2, 3, 4


@dataclass(frozen=True, eq=False)  # eq=False: it holds a tensor
class Epilogue:
    """What the fused Linear does after its GEMM: ``s·acc + b``, the GELU if asked, fp8 codes or bf16 out.

    One argument for `fp8_linear`, `tuned` and `reference`, which apply, time and check the same epilogue.
    ``scale``: the activations' scale times the weights' (one number each); ``bias``: (N,) float32 or
    bfloat16; ``gelu``: apply the GELU after the bias, in the form ``approximate`` (one of `APPROXIMATE`,
    module doc); ``out_scale``: quantize the result to e4m3 codes at this scale (the next Linear's input
    scale), None for bf16.
    """

    scale: float
    bias: torch.Tensor
    gelu: bool = False
    out_scale: float | None = None
    approximate: str = "none"

    def gelu_code(self, device: torch.device) -> int:
        """The kernels' GELU constexpr: `GELU_OFF`, `GELU_ERF`, `GELU_ERF_POLY`, or the tanh form for ``device``."""
        if not self.gelu:
            return GELU_OFF
        if self.approximate != "tanh":
            return GELU_ERF if self.approximate == "none" else GELU_ERF_POLY
        return GELU_TANH_PTX if device.type == "cuda" else GELU_TANH_EXP


@triton.jit
def _gelu(y, GELU: tl.constexpr):
    if GELU == 1:
        out = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif GELU == 4:  # y·Φ(y), Φ(-|y|) = erfc(|y|/√2)/2 by Abramowitz & Stegun 7.1.26, no branch
        x = tl.abs(y) * 0.7071067811865476
        t = 1.0 / (1.0 + 0.3275911 * x)
        poly = t * (
            0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
        )
        tail = 0.5 * poly * tl.exp(-x * x)  # Φ(-|y|), computed directly: no cancellation for y < 0
        out = y * tl.where(y >= 0, 1.0 - tail, tail)
    else:
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        if GELU == 2:
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                          pack=1)  # fmt: skip
        else:
            t = 2.0 / (1.0 + tl.exp(-2.0 * tl.maximum(u, -20.0))) - 1.0  # tanh(-20) is -1 in fp32: no inf
        out = 0.5 * y * (1.0 + t)
    return out


@triton.jit
def _epilogue(acc, scale, bias, out_inv_scale, GELU: tl.constexpr, OUT_FP8: tl.constexpr):
    """``scale·acc + bias``, GELU if asked (`GELU_ERF` …), then e4m3 codes at ``1/out_inv_scale`` or bf16."""
    y = acc * scale + bias[None, :].to(tl.float32)
    if GELU:
        y = _gelu(y, GELU)
    if OUT_FP8:
        out = tl.minimum(tl.maximum(y * out_inv_scale, -448.0), 448.0).to(tl.float8e4nv)
    else:
        out = y.to(tl.bfloat16)
    return out


@triton.jit
def fp8_linear_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    scale,
    out_inv_scale,
    M,
    N,
    K,
    GELU: tl.constexpr,
    OUT_FP8: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out[M, N] = epilogue(scale · Σ_k A[m, k]·W[n, k] + bias[n]); K a multiple of BK, N of BN."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
    w_ptrs = w_ptr + rn[None, :] * K + rk[:, None]  # Wᵀ's (k, n) tile from W's rows
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptrs + k, mask=m_ok[:, None], other=0.0)
        acc = tl.dot(a, tl.load(w_ptrs + k), acc)
    out = _epilogue(acc, scale, tl.load(bias_ptr + rn), out_inv_scale, GELU, OUT_FP8)
    tl.store(out_ptr + (rm[:, None] * N + rn[None, :]), out, mask=m_ok[:, None])  # 32-bit offsets


@triton.jit(do_not_specialize=["M"])
def fp8_linear_persistent_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, scale, out_inv_scale, M, N, K: tl.constexpr, GELU: tl.constexpr,
    OUT_FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, TMA_EPILOGUE: tl.constexpr, EPI_N: tl.constexpr,
):  # fmt: skip
    """`fp8_linear_kernel`'s result from a persistent grid fed by TMA (`quant.persistent`'s pattern).

    One program per SM (or ``TileConfig.persistent`` per SM) walks output tiles NUM_SMS apart; A's and W's
    blocks arrive through device-side tensor descriptors and the walk and the K loop are one flattened,
    software-pipelined loop, so the next tile's loads run during this tile's GELU and quantization, the
    part of the fused kernel that the grouped one could not hide. ``TMA_EPILOGUE`` stores the output
    through a descriptor too. ``EPI_N`` = BN/2 finishes the tile in two halves (Triton's tutorial's
    epilogue subtiling, ``TileConfig.split_epilogue``): compiled for sm_90 (Triton 3.6 and 3.8), the
    128×256 tile's whole GELU epilogue takes all 255 registers and spills; in halves, about 200 and none.
    ``tl.range(warp_specialize=True)`` is no variant: Triton 3.8 compiles the same sm_90 code with it as
    without it (by PTX; its tutorial: Blackwell only).
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    if TMA_EPILOGUE:
        dst = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EPI_N])
    else:
        dst = out_ptr
    start = tl.program_id(0)
    tile_c = start - NUM_SMS  # the epilogue's own counter, as in Triton's persistent tutorial
    for tile in tl.range(start, tile_count(M, N, BM, BN), NUM_SMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, M, N, BM, BN, GROUP_M)
        acc = tile_product(a_desc, w_desc, pid_m, pid_n, K, BM, BN, BK, False)
        tile_c += NUM_SMS
        pid_m, pid_n = _grouped_tile(tile_c, M, N, BM, BN, GROUP_M)
        row0, col0 = pid_m * BM, pid_n * BN
        if EPI_N < BN:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, EPI_N)), (0, 2, 1)))
            _finish_part(left, dst, row0, col0, bias_ptr, scale, out_inv_scale, M, N, BM, EPI_N, GELU, OUT_FP8,
                         TMA_EPILOGUE)  # fmt: skip
            _finish_part(right, dst, row0, col0 + EPI_N, bias_ptr, scale, out_inv_scale, M, N, BM, EPI_N, GELU,
                         OUT_FP8, TMA_EPILOGUE)  # fmt: skip
        else:
            _finish_part(acc, dst, row0, col0, bias_ptr, scale, out_inv_scale, M, N, BM, BN, GELU, OUT_FP8,
                         TMA_EPILOGUE)  # fmt: skip


@triton.jit
def _finish_part(
    acc, dst, row0, col0, bias_ptr, scale, out_inv_scale, M, N, BM: tl.constexpr, W: tl.constexpr,
    GELU: tl.constexpr, OUT_FP8: tl.constexpr, TMA_EPILOGUE: tl.constexpr,
):  # fmt: skip
    """The epilogue of the [BM, W] block at (row0, col0), stored through ``dst`` (a descriptor, or out_ptr)."""
    rn = col0 + tl.arange(0, W)
    out = _epilogue(acc, scale, tl.load(bias_ptr + rn), out_inv_scale, GELU, OUT_FP8)
    if TMA_EPILOGUE:
        dst.store([row0, col0], out)  # rows past M are clipped by the copy engine
    else:
        rm = row0 + tl.arange(0, BM)
        tl.store(dst + (rm[:, None] * N + rn[None, :]), out, mask=(rm < M)[:, None])


def fp8_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    epi: Epilogue,
    tile: TileConfig | None = None,
    num_programs: int | None = None,
) -> torch.Tensor:
    """``A·Wᵀ·scale + bias``, then GELU if asked; fp8 codes at ``out_scale`` if given, else bf16 (`Epilogue`).

    Args:
        a: (M, K) float8_e4m3fn activations' codes, contiguous.
        w: (N, K) float8_e4m3fn weight codes, contiguous.
        epi: the scale, bias, GELU and output format.
        tile: block sizes; the default suits large M on Hopper. A ``persistent`` tile runs
            `fp8_linear_persistent_kernel` (TMA, Hopper; the interpreter on the CPU), any other the grouped
            `fp8_linear_kernel`.
        num_programs: a persistent tile's grid stride (`persistent.persistent_grid`; tests).
    """
    t, bias = tile or FP8_LINEAR_TILE, epi.bias
    m, k = a.shape
    n = w.shape[0]
    check(
        a.dtype == w.dtype == torch.float8_e4m3fn, f"A and W must be float8_e4m3fn, not {a.dtype}/{w.dtype}"
    )
    check(a.is_contiguous() and w.is_contiguous() and w.shape[1] == k, "A (M, K) and W (N, K), contiguous")
    check(k % t.bk == 0 and n % t.bn == 0, f"K={k} must divide by BK={t.bk} and N={n} by BN={t.bn}")
    check(
        bias.shape == (n,) and bias.dtype in (torch.float32, torch.bfloat16) and bias.is_contiguous(),
        "bias: float32 or bfloat16 of shape (N,), contiguous",
    )
    check(
        epi.approximate in APPROXIMATE, f"approximate must be one of {APPROXIMATE}; got {epi.approximate!r}"
    )
    out_fp8 = epi.out_scale is not None
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn if out_fp8 else torch.bfloat16, device=a.device)
    operands = (a, w, bias, out, float(epi.scale), 1.0 / epi.out_scale if out_fp8 else 1.0, m, n)
    flags = {"GELU": epi.gelu_code(a.device), "OUT_FP8": out_fp8, **t.launch()}
    if t.persistent:
        check_tma(a=a, w=w, out=out)
        nsm, grid = persistent_grid(a.device, m, n, t, num_programs)
        launcher(fp8_linear_persistent_kernel, a.device)[(grid,)](
            *operands, K=k, NUM_SMS=nsm, TMA_EPILOGUE=bool(t.tma_epilogue),
            EPI_N=t.bn // 2 if t.split_epilogue and t.bn >= 32 else t.bn, **flags,  # halves ≥ 16 columns
        )  # fmt: skip
    else:
        launcher(fp8_linear_kernel, a.device)[(triton.cdiv(m, t.bm) * (n // t.bn),)](*operands, k, **flags)
    return out


def tuned(a: torch.Tensor, w: torch.Tensor, epi: Epilogue, cublaslt=None) -> TileConfig | str:
    """The fastest tile for this call's (M, K, N, epilogue) on its GPU, timed once per process.

    The candidates: ``cublaslt`` first where given (a call running this Linear through ``torch._scaled_mm``,
    named `CUBLASLT` when it wins: a bias-only Linear then never loses to cuBLASLt), the grouped kernel's
    `FP8_LINEAR_TILE` and, on Hopper (TMA), every tile of `tiles.linear_persistent_configs` no taller than
    M, each fitted to K and N, timed in a CUDA graph by the GEMV's tuner (`gemv.fastest`). On a CPU, or
    under CUDA-graph capture, the first candidate untimed; the engine picks every tile in one eager pass
    before it compiles (`linear_choice.choose_kernels`), so a captured network finds its tiles chosen.
    """
    m, k = a.shape
    n, out_fp8 = w.shape[0], epi.out_scale is not None

    def cands():  # made only when this key is not timed yet (an eager call after the first costs nothing)
        if cublaslt is not None:
            yield CUBLASLT
        yield FP8_LINEAR_TILE.fit(k, n)
        if a.device.type == "cuda" and torch.cuda.get_device_capability(a.device) >= (9, 0):
            # no tile taller than the input (a batch-1 ff1): its TMA box would outgrow the tensor it reads
            tiles = linear_persistent_configs(k, n, 1 if out_fp8 else 2)
            yield from (t for t in tiles if t.bm <= m)

    def call(t):
        if t == CUBLASLT:
            return cublaslt()
        return fp8_linear(a, w, epi, t)

    form = epi.approximate if epi.gelu else ""
    key = ("fp8_linear", m, k, n, epi.gelu, out_fp8, form, cublaslt is not None, str(a.device))
    return fastest(key, a.device, cands(), call)


def tuned_tiles() -> dict[tuple[int, int, int], TileConfig | str]:
    """The tiles `tuned` timed fastest in this process, by (M, K, N): what a benchmark row reports."""
    from deepgap.measure.quant.gemv import _TUNED

    return {k[1:4]: t for k, t in _TUNED.items() if k[0] == "fp8_linear"}


def kernel_label(t: TileConfig | str) -> str:
    """A `tuned` choice as text: `CUBLASLT`, or the tile's label."""
    return t if isinstance(t, str) else t.label


@torch.library.custom_op("deepgap::fp8_linear", mutates_args=())
def fp8_linear_op(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    gelu: bool,
    out_scale: float,
    tile: list[int],
    approximate: str,
) -> torch.Tensor:
    """`fp8_linear` as a torch custom op (one call to torch.compile, captured by a CUDA graph).

    Its schema takes plain values, made into an `Epilogue` here: ``out_scale`` ≤ 0 is bf16 out. ``tile`` is
    `TileConfig.fields`, [] for `tuned` (Triton tiles only).
    """
    epi = Epilogue(scale, bias, gelu, out_scale if out_scale > 0 else None, approximate)
    if a.data_ptr() % 16:  # a view the compiler placed off a 16-byte boundary: a TMA descriptor needs one
        a = a.clone()
    return fp8_linear(a, w, epi, TileConfig.from_fields(tile) if tile else tuned(a, w, epi))


@fp8_linear_op.register_fake
def _(a, w, bias, scale, gelu, out_scale, tile, approximate):
    dtype = torch.float8_e4m3fn if out_scale > 0 else torch.bfloat16
    return a.new_empty((a.shape[0], w.shape[0]), dtype=dtype)


def reference(a: torch.Tensor, w: torch.Tensor, epi: Epilogue) -> torch.Tensor:
    """The same arithmetic in fp32 torch: what the kernel is held to."""
    y = (a.float() @ w.float().t()) * epi.scale + epi.bias.float()
    if epi.gelu:
        y = torch.nn.functional.gelu(y, approximate="tanh" if epi.approximate == "tanh" else "none")
    if epi.out_scale is None:
        return y.to(torch.bfloat16)
    return (y * (1.0 / epi.out_scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
