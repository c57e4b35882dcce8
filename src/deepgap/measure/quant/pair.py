"""Two chained 1×1 convolutions in one kernel: a block's last 1×1 and the next block's first (Hopper, TMA).

Why: in a ResNet bottleneck the block's output ``T`` (``conv3``: 1×1, K = C_mid, N = 4·C_mid, + residual,
ReLU) is read back at once by the next block's ``conv1`` (1×1, K = 4·C_mid, N = C_mid). Separately, ``T`` is
written by one kernel and read whole by the next; in layer1 at batch 1024 both are memory-bound (2.2–2.5 TB/s
in session 27), and the read of ``T`` is ~45% of ``conv1``'s bytes. Here a persistent program (one or two an
SM) loads both weight matrices once (each ≤ 256 × 256, one TMA box) and walks tiles of BM rows: A and the
residual arrive through the loop's pipeline stages, ``T`` = the engine's epilogue of A·W1ᵀ (+ γ·residual,
ReLU, requantized to the 8-bit format ``T`` is stored in) is stored (it is still the next block's residual)
and multiplied, still in registers, by W2ᵀ; the second epilogue writes ``U``. ``T`` is never read back, and a
launch goes. This is CUTLASS's back-to-back GEMM fusion, on the engine's epilogue. (A chunked form, ``T``'s
columns 128 at a time with the weights read per chunk, for the wider layer2/layer3 pairs, lost everywhere but
once on one H200: results/h200/session28/pair-chunked-1.txt.)

Exactness: the second GEMM reads the very 8-bit values the first wrote, so int8 is bit-exact against the
separate kernels; fp8 differs only by fp32 summation order. Every operand moves through TMA descriptors
(`tl.make_tensor_descriptor`; rows past M zero-filled on load, clipped on store), which the Triton
interpreter also runs, so the CPU tests check this kernel as written. Which pairs run fused, and in which
tile, is timed per network (`pair_choice`).
"""

# Triton convention: compile-time (constexpr) parameters in capitals; constexpr branches stay if/else.
# ruff: noqa: N803

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.kernels import OUT_KIND, _finish, _mma, _widen
from deepgap.measure.quant.launch import INT32_LIMIT, check, check_vec, launcher

MAX_BLOCK = 256  # elements along one side of a TMA box: K1, N1 and N2 each fit one descriptor block
REG_BUDGET = 192  # accumulator registers per thread a tile may hold (both GEMMs' results live at once)
# bytes of shared memory one SM gives its programs (228 KB on an H200, less 1 KB a block for the runtime)
SMEM_BUDGET = 226 * 1024


@dataclass(frozen=True)
class PairConfig:
    """A tile of `pair_kernel`: BM rows a tile, warps, pipeline stages of the tile walk, programs per SM."""

    bm: int
    num_warps: int = 8
    num_stages: int = 3
    per_sm: int = 1
    t_store: int = 1  # T's store: 0 TMA before the second MMA, 1 TMA after it, 2 by pointers after it

    @property
    def label(self) -> str:
        """Short text form, e.g. 'pair 64 w8 s3 x2' (x2: two programs an SM)."""
        return (
            f"pair {self.bm} w{self.num_warps} s{self.num_stages} x{self.per_sm}"
            + ("", " tma-late", " ptr")[self.t_store]
        )

    def launch(self) -> dict[str, int]:
        """The launch's constexpr and options."""
        return {
            "BM": self.bm,
            "T_STORE": self.t_store,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }

    def fits(self, k1: int, n1: int, n2: int) -> bool:
        """Whether this tile can run the pair (K1, N1, N2): TMA boxes, registers, shared memory.

        Registers: the first GEMM's [BM, N1] result and the second's [BM, N2] live at once, so
        BM·(N1 + N2) 4-byte values over the threads stay within `REG_BUDGET` each. Shared memory, per SM:
        each program's resident weights, its pipeline's A and residual tiles, and T's and U's store buffers.
        """
        if max(k1, n1, n2) > MAX_BLOCK or k1 % 16 or n1 % 16 or n2 % 16:
            return False
        regs = self.bm * (n1 + n2) // (32 * self.num_warps)
        weights, act = n1 * k1 + n2 * n1, self.bm * (k1 + n1)
        smem = self.num_stages * act + weights + self.bm * (n1 + n2)
        return regs <= REG_BUDGET and smem * self.per_sm <= SMEM_BUDGET


# The tiles timed on one H200 (session 28, results/h200/session28/pair-persistent-*.jsonl and
# pair-x2-8.jsonl; layer1's two pair shapes at batch 1024). Two 64-row programs an SM on 4 warps, 3 stages,
# won where they fit (N2 = 64: fp8 644 against 826 µs for 128 rows on 8 warps, one program an SM; int8 771
# against 829): one program's epilogue runs while the other's loads and MMAs do. Beside N2 = 128 only 2
# stages fit two programs (fp8 915 against 980; int8 1,141 against 971, so 128 rows stay offered). Slower and
# not offered: 2 stages at 128 rows (1.25×), 64 rows on 8 warps (1.5–1.9×), the weights re-read from L2 each
# tile instead of resident (1.3×). T's store: in int8 by pointers or by TMA before the second MMA (both
# right); in fp8 only the TMA store after the second MMA came out right: before it, or by pointers, 20–43%
# of T's elements were wrong on the GPU (U right, the interpreter right) under Triton 3.6, so fp8 is offered
# that form only.
CANDIDATES = {
    "int8": (
        PairConfig(128, 8, 3, t_store=2),
        PairConfig(128, 8, 3, t_store=0),
        PairConfig(64, 4, 2, 2, t_store=2),
        PairConfig(64, 4, 3, 2, t_store=2),
    ),
    "fp8": (
        PairConfig(128, 8, 3, t_store=1),
        PairConfig(64, 4, 2, 2, t_store=1),
        PairConfig(64, 4, 3, 2, t_store=1),
    ),
}


def pair_configs(k1: int, n1: int, n2: int, qfmt: str) -> list[PairConfig]:
    """The tiles the tuner times for a pair with these channel counts in ``qfmt`` (`CANDIDATES` that fit)."""
    return [c for c in CANDIDATES[qfmt] if c.fits(k1, n1, n2)]


@triton.jit(do_not_specialize=["M", "NUM_PROGRAMS"])
def pair_kernel(
    x_ptr, w1_ptr, t_ptr, a1_ptr, b1_ptr, res_ptr, gamma, w2_ptr, u_ptr, a2_ptr, b2_ptr, M, NUM_PROGRAMS,
    K1: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, RELU1: tl.constexpr, HAS_RES: tl.constexpr,
    OUT1: tl.constexpr, RELU2: tl.constexpr, OUT2: tl.constexpr, ACC_INT: tl.constexpr, BM: tl.constexpr,
    T_STORE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """T = epi1(x·W1ᵀ [+ γ·res]) [M, N1] and U = epi2(T·W2ᵀ) [M, N2], BM rows a tile, tiles NUM_PROGRAMS apart.

    Both weight matrices (≤ 256 × 256 each) are loaded once per program and stay resident through the
    walk, so a tile moves only its activations: A and the residual in (pipelined ahead by the loop's
    stages), T and U out through TMA stores (T: ``T_STORE`` 0 before the second MMA, 1 after it, 2 by pointers).
    """
    pdl_enter(PDL)
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K1], strides=[K1, 1], block_shape=[BM, K1])
    w1_desc = tl.make_tensor_descriptor(w1_ptr, shape=[N1, K1], strides=[K1, 1], block_shape=[N1, K1])
    t_desc = tl.make_tensor_descriptor(t_ptr, shape=[M, N1], strides=[N1, 1], block_shape=[BM, N1])
    w2_desc = tl.make_tensor_descriptor(w2_ptr, shape=[N2, N1], strides=[N1, 1], block_shape=[N2, N1])
    u_desc = tl.make_tensor_descriptor(u_ptr, shape=[M, N2], strides=[N2, 1], block_shape=[BM, N2])
    if HAS_RES:
        r_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, N1], strides=[N1, 1], block_shape=[BM, N1])
    w1t = w1_desc.load([0, 0]).T
    w2t = w2_desc.load([0, 0]).T
    rn1 = tl.arange(0, N1)
    rn2 = tl.arange(0, N2)
    if ACC_INT:
        zero1 = tl.zeros((BM, N1), dtype=tl.int32)
        zero2 = tl.zeros((BM, N2), dtype=tl.int32)
    else:
        zero1 = tl.zeros((BM, N1), dtype=tl.float32)
        zero2 = tl.zeros((BM, N2), dtype=tl.float32)
    for tile in tl.range(tl.program_id(0), (M + BM - 1) // BM, NUM_PROGRAMS):
        row = tile * BM
        y = _mma(x_desc.load([row, 0]), w1t, zero1, ACC_INT).to(tl.float32) * tl.load(a1_ptr + rn1)[None, :]
        r = y
        if HAS_RES:
            r = _widen(r_desc.load([row, 0]))
        t = _finish(y, tl.load(b1_ptr + rn1)[None, :], r, gamma, RELU1, HAS_RES, OUT1)
        if T_STORE == 0:
            t_desc.store([row, 0], t)
        y2 = _mma(t, w2t, zero2, ACC_INT).to(tl.float32) * tl.load(a2_ptr + rn2)[None, :]
        if T_STORE == 1:
            t_desc.store([row, 0], t)
        elif T_STORE == 2:
            rm = row + tl.arange(0, BM)
            tl.store(t_ptr + rm[:, None] * N1 + rn1[None, :], t, mask=(rm < M)[:, None])
        u_desc.store([row, 0], _finish(y2, tl.load(b2_ptr + rn2)[None, :], y2, 0.0, RELU2, False, OUT2))


def run(
    first, second, x: torch.Tensor, res: torch.Tensor | None, cfg: PairConfig, out=None, num_programs=None
):
    """(T, U): ``first`` (a `layers.QConv`, 1×1) on NHWC rows ``x`` with ``res``, then ``second`` on T.

    Both layers quantized, 1×1, stride 1, unpadded; T in the 8-bit format ``second`` reads. ``out``: a
    (T, U) pair of tensors to write into (default: new ones); ``num_programs``: the SMs to fill (default: the
    device's, `persistent.programs`), ``cfg.per_sm`` programs each. A ``ValueError`` names what does not fit.
    """
    from deepgap.measure.quant.layers import DTYPES
    from deepgap.measure.quant.persistent import check_tma, programs, use_descriptors

    f, s = first.node, second.node
    for n in (f, s):
        check(
            n.pointwise,
            f"a fused pair runs 1×1 stride-1 unpadded convolutions; {n.name} has k={n.kernel_size}, "
            f"stride={n.stride}, padding={n.padding}",
        )
    check(s.residual is None, f"the pair's second convolution {s.name} must have no residual")
    check(
        first.out_fmt == second.in_fmt and first.out_fmt in ("int8", "fp8") and x.dtype == first.w_q.dtype,
        f"{f.name}'s output ({first.out_fmt}) must be the 8-bit input {s.name} reads ({second.in_fmt}), "
        f"and x ({x.dtype}) its weights' format ({first.w_q.dtype})",
    )
    m, k1 = x.shape
    n1, n2 = f.cout, s.cout
    check(x.is_contiguous() and k1 == f.cin, f"x must be contiguous [M, {f.cin}]; got {tuple(x.shape)}")
    check(cfg.fits(k1, n1, n2), f"{cfg.label} cannot run K1={k1}, N1={n1}, N2={n2} (see PairConfig.fits)")
    check(m * n1 <= INT32_LIMIT, f"[{m}, {n1}] has more than 2^31 elements; use a smaller batch")
    for name, v, n in (("alpha1", first.alpha, n1), ("beta1", first.beta, n1)):
        check_vec(name, v, n, x.device)
    for name, v, n in (("alpha2", second.alpha, n2), ("beta2", second.beta, n2)):
        check_vec(name, v, n, x.device)
    check(
        (res is None) == (f.residual is None)
        and (res is None or (res.shape == (m, n1) and res.is_contiguous())),
        f"{f.name} {'takes a' if f.residual else 'has no'} residual [{m}, {n1}]",
    )
    if out is None:
        out = (
            torch.empty((m, n1), dtype=DTYPES[first.out_fmt], device=x.device),
            torch.empty((m, n2), dtype=DTYPES[second.out_fmt], device=x.device),
        )
    t, u = out
    check_tma(x=x, w1=first.w_q, t=t, residual=res, w2=second.w_q, u=u)
    use_descriptors(x.device)
    nprog = min(
        triton.cdiv(m, cfg.bm), (programs(x.device) if num_programs is None else num_programs) * cfg.per_sm
    )
    launcher(pair_kernel, x.device)[(nprog,)](
        x, first.w_q, t, first.alpha, first.beta, res if res is not None else t, float(first.gamma),
        second.w_q, u, second.alpha, second.beta, m, nprog,
        K1=k1, N1=n1, N2=n2, RELU1=bool(f.relu), HAS_RES=res is not None, OUT1=OUT_KIND[first.out_fmt],
        RELU2=bool(s.relu), OUT2=OUT_KIND[second.out_fmt], ACC_INT=x.dtype == torch.int8,
        **cfg.launch(), enable_fp_fusion=False,
    )  # fmt: skip
    return t, u


def reference(first, second, x: torch.Tensor, res: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair by the exact float64 reference of each layer (`layers.conv_reference`), one after the other."""
    from deepgap.measure.quant import layers

    rows = x.shape[0]
    t = layers.conv_reference(first, x, (1, rows, 1), res)
    return t, layers.conv_reference(second, t, (1, rows, 1), None)
