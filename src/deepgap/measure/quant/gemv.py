"""fp8 (or int8) weights times bf16 activations for a few rows: the decode step's Linear at a small batch.

Why a kernel of its own: a decoder's step at batch 1–16 reads every weight once per token and does
almost no arithmetic, so its speed is HBM bandwidth over weight bytes. fp8 weights halve the bytes of
bf16, but ``torch._scaled_mm`` wants fp8 activations too (a per-token quantization kernel per Linear)
and cuBLASLt's fp8 kernels are built for large M. Here the activations stay bf16 (weight-only
quantization: nothing is lost on the activations' side), each program reads a ``BN × K`` band of the
weight's fp8 codes once, converts them in registers and multiplies them on the tensor cores with the
``M ≤ 16`` rows (padded to 16 by masking), then applies the per-channel scale (and bias) in fp32.

``SPLIT_K > 1`` splits K over that many programs per band, which add their partial sums into an fp32
buffer (atomics): a Linear with few output channels and a long K (Llama's ``down_proj``, N 4096,
K 14336) otherwise has too few programs to keep every SM's loads in flight.

`reference` is the same arithmetic in fp32 torch. On CPU tensors the kernel runs in Triton's interpreter
(`deepgap.measure.quant.launch`), as the tests do.
"""

# ruff: noqa: N803

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch
import triton
import triton.language as tl

from deepgap.measure.quant import launch, step_tiles, streamed
from deepgap.measure.quant.gdc import pdl_enter, pdl_launch, pdl_wait
from deepgap.measure.quant.launch import check, halved_to_divide, launcher

CODES = (torch.float8_e4m3fn, torch.int8)  # both convert to bf16 exactly (3 mantissa bits; |v| ≤ 127)
# ``reduce_each`` 2: each step's products summed within a thread, a run of RUN neighbouring codes (one 16-byte load of
# 8-bit codes), and across threads once at the end (`mac`). Why: a reduce-each tile's per-step sum across threads is 22
# warp shuffles and a block barrier a step at sm_90, in every step of down's seven; the loads of the next step wait
# behind it. On one H200 (session 40, `benchmarks/gemv_ceiling.py`) down's fp8 GEMV took 16.68 µs against its tile's
# loads' 13.75 (gate_up's one step: 28.53 against 26.93).
IN_THREAD = tl.constexpr(2)
RUN = tl.constexpr(16)
MAX_AHEAD = 2  # K steps a fused row GEMV's program loads before PDL's wait, at most (`GemvTile.ahead`: 0-2)
MAX_ROWS = 16  # the rows one tensor-core tile holds: more rows belong to a GEMM (`QuantLinear`)


@dataclass(frozen=True)
class GemvTile:
    """A launch configuration: output channels per program, K per step, K splits, warps, stages."""

    bn: int = 32
    bk: int = 512
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # one row: issue the next K step's weight load before this step's arithmetic (two steps' bytes in flight)
    prefetch: int = 0
    # one row: reduce each step's BN × BK products to BN sums at once, not once at the end (`ROW_TILES`); 2: within
    # each thread at once, across threads at the end (`IN_THREAD`)
    reduce_each: int = 0
    # registers a thread at most (ptxas's .maxnreg; 0: the compiler's choice), `NORM_TILES`
    maxnreg: int = 0
    # a fused row GEMV under PDL: K steps (≤ `MAX_AHEAD`) loaded before the wait (`gemv_fused`'s ``PRE``; forced only)
    ahead: int = 1

    def describe(self, short: bool = False) -> str:
        """The tile as a decode row's ``decode.tiles`` names it (`chosen`); ``short``: `compile_sm90.py`'s labels."""
        flags = [
            ("prefetch", "pf", self.prefetch),
            ("reduce-each", "re", self.reduce_each == 1),
            ("reduce-in-thread", "rt", self.reduce_each == IN_THREAD.value),
            (f"maxnreg {self.maxnreg}", f"r{self.maxnreg}", self.maxnreg),
            (f"ahead {self.ahead}", f"a{self.ahead}", self.ahead != 1),
        ]
        head = f"{self.bn}x{self.bk} s{self.split_k} w{self.num_warps} st{self.num_stages}"
        return " ".join([head] + [brief if short else word for word, brief, on in flags if on])

    def fit(self, k: int, n: int) -> GemvTile:
        """This tile with BK halved until ``k`` is ``split_k`` × BK steps, BN until it divides n, ``ahead`` ≤ steps."""
        split = self.split_k
        while split > 1 and k % (split * 16):
            split //= 2
        bk, bn = halved_to_divide(self.bk, k // split, 16), halved_to_divide(self.bn, n, 1)
        ahead = min(self.ahead, MAX_AHEAD, k // (split * bk))
        return dataclasses.replace(self, bn=bn, bk=bk, split_k=split, ahead=ahead)


# One row (batch-1 decode), on the CUDA cores (one row has no use for a tensor core). The candidates `tuned`
# times. Each program keeps a BN × BK block of fp32 partial products and reduces it once at the end: the
# four that led some Llama-8B shape on one H200 (session 18), each with and without the prefetch. Or
# (``reduce_each``) it reduces every step to BN sums: a block's accumulators no longer hold registers, so a
# step can be 8-16 KB of weights (a whole 4096-wide row band at once), more bytes in flight per program.
ROW_TILES = tuple(
    GemvTile(bn, bk, 1, 4, st, prefetch)
    for prefetch in (0, 1)
    for bn, bk, st in [(4, 1024, 3), (8, 512, 4), (2, 2048, 3), (16, 512, 3)]
) + tuple(
    GemvTile(bn, bk, 1, w, 1, 0, 1) for bn, bk, w in [(4, 4096, 4), (4, 4096, 8), (8, 2048, 8), (2, 4096, 4)]
)
# summed within the thread (`IN_THREAD`); one H200 (session 41): down's fp8 GEMV 16.64 → 15.25 µs, int8's gate_up
# 42.24 → 32.83. The fused GEMVs take them and the row kernel's unprefetched (SwiGLU has two bands in flight)
IN_THREAD_TILES = tuple(GemvTile(bn, 2048, 1, w, 1, 0, IN_THREAD.value) for bn, w in [(8, 8), (4, 4)])
FUSED_TILES = tuple(t for t in ROW_TILES if not t.prefetch) + IN_THREAD_TILES
# The one-step tiles with a register cap, for the GEMVs that fold the RMSNorm (`Fusion.tiles`; only layer 0's qkv
# now). One H200 (session 38): the fold took gate_up's 4 × 4096 tile from 128 to 178 registers (29.70 → 43.70 µs);
# 168 fits 3 programs an SM, 128 fits 4 with spills. Session 39: the 168 cap won qkv's fold there (9.93 vs 10.26).
NORM_TILES = tuple(GemvTile(bn, 4096, 1, 4, 1, 0, 1, cap) for bn, cap in [(4, 168), (4, 128), (2, 128)])
# 2-16 rows: the tensor cores, rows padded to 16 (session 18's first sweep: BN 32, BK 512 led at most shapes)
DOT_TILES = tuple(
    GemvTile(bn, bk, split, w, st)
    for bn, bk, split, w, st in [
        (32, 512, 1, 4, 4), (32, 256, 2, 4, 4), (64, 256, 1, 4, 4), (16, 512, 1, 4, 4), (64, 512, 1, 8, 3),
    ]
)  # fmt: skip
_TUNED: dict[tuple, object] = {}  # key → the fastest tile (GEMV tiles, and `linear_kernels.tuned`'s)
PINNED: dict[tuple, object] = {}  # key → its tile set untimed (`gemv_fused.QKV_TILE`): `chosen` says so
T = TypeVar("T")


def tuned(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> GemvTile:
    """The fastest candidate tile for this call's (rows, K, N) on its GPU, timed once per process.

    Why time rather than rule: the best block shape moves with N, K and the GPU (session 18's sweep on one H200: 2x
    between candidates of one shape). On a CPU, or while a CUDA graph is captured (no synchronising there), the first
    candidate is taken untimed; the decode loop's warm-up runs before its capture, so a captured step's are timed.
    """
    (m, k), n = x.shape, codes.shape[0]
    cands = (c.fit(k, n) for c in (ROW_TILES if m == 1 else DOT_TILES))
    call = lambda t, w: fp8_gemv(x, w, scale, None, t)  # noqa: E731 - the candidate on matrix w
    return fastest((m, k, n, str(x.device)), x.device, cands, call, decode=True, weights=codes)


def fastest(
    key: tuple, device: torch.device, cands: Iterable[T], call, decode: bool = False, weights=None
) -> T:
    """The candidate whose ``call(tile)`` is fastest in a CUDA graph, once per ``key`` and process (`tuned`).

    ``cands`` may be a generator (a key timed already fits none); any hashable tile type (`linear_kernels.tuned`
    times its `TileConfig`s here). ``decode``: a decode step's GEMV, timed under programmatic dependent launch
    where a decode graph may use it (`timed_under_pdl`): each launch's first loads then overlap its
    predecessor's tail, and the tile that wins alone need not win there; one choice serves both graphs, so
    their logits stay bit-equal (`llm_steps._kept`). Session 22 (one H200, 8B fp8, batch 1): the same step ran
    392.6 tokens/s where its tiles were timed under PDL, 357 where they were not. ``weights``: the matrix a
    decode GEMV reads, then ``call(tile, matrix)``; with ``DEEPGAP_GEMV_TUNE=streamed`` the timed calls cycle
    through copies of it (`quant.streamed`).
    """
    if key in _TUNED:
        return _TUNED[key]
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return next(iter(cands))
    times, failed = {}, []
    ws = [] if weights is None else streamed.streamed_copies(weights) if streamed.streaming() else [weights]

    def run(t, i: int = 0):  # a candidate's i-th call: on matrix i mod len(ws) where the matrix is passed
        return call(t, ws[i % len(ws)]) if ws else call(t)

    with launch.pdl() if decode and timed_under_pdl(device) else contextlib.nullcontext():
        for t in dict.fromkeys(cands):
            try:  # compiles before any capture: a candidate this GPU or Triton cannot build is passed over
                run(t)
            except Exception as e:  # noqa: BLE001 - any build failure of one candidate
                failed.append(f"{t}: {type(e).__name__}")
                continue
            times[t] = _graph_ms(lambda i, t=t: run(t, i))
    check(bool(times), f"no GEMV tile builds for {key}: {'; '.join(failed)}")
    _TUNED[key] = min(times, key=times.get)
    return _TUNED[key]


def timed_under_pdl(device: torch.device) -> bool:
    """Whether a decode graph on ``device`` may use PDL (`pdl_choice.decode_modes`: Hopper, not turned off)."""
    from deepgap.measure.quant.pdl_choice import decode_modes

    return True in decode_modes(device)


def chosen() -> str:
    """The tiles this process's tuner chose, one ``shape: tile`` per timed key (a decode row's ``decode.tiles``).

    Why recorded: each process times its tiles once (`fastest`), and they decide the step's speed (session
    22: the same step at 392.6 and 357 tokens/s in two processes).
    """

    def shape(key: tuple) -> str:
        # ("fused", (gamma, swiglu, residual, rope, handed, hand), k, n, device)
        if key[0] == "fused":
            parts = ("norm", "swiglu", "residual", "rope", "handed norm", "norm hand-off")
            what = "+".join(p for p, on in zip(parts, key[1], strict=False) if on) or "plain"
            return f"fused {what} {key[2]}x{key[3]}"
        return f"{key[0]} row(s) {key[1]}x{key[2]}"

    # the GEMV tiles only: the fused Linear's `TileConfig`s share the table (`linear_kernels.tuned_tiles`)
    tiles = [f"{shape(k)}: {t.describe()}" for k, t in _TUNED.items() if isinstance(t, GemvTile)]
    pin = " (qkv's tile pinned, untimed)" if any(_TUNED.get(k) == t for k, t in PINNED.items()) else ""
    return "; ".join(tiles) + (streamed.label() + step_tiles.label() if tiles else "") + pin


def _graph_ms(launch, calls: int = 20) -> float:
    """Milliseconds of ``calls`` launches (``launch(i)``, i the call's index) in one CUDA graph, best of 3 replays.

    Why a graph: a launch from Python costs more host time than these kernels take on the device, so
    launches timed back to back measure the host; in a graph they run as the decode step's graph runs them.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(0)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            launch(i)
    best = float("inf")
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b))
    return best


@triton.jit
def mac(acc, w, x, REDUCE: tl.constexpr):
    """``acc + w · x`` per row: kept BN × BK (summed at the end, `total`), summed to BN now, or by runs.

    ``REDUCE`` 0, 1, or 2 (`IN_THREAD`): each run of `RUN` neighbouring codes summed now, BN × BK/RUN kept.
    """
    prod = w.to(tl.float32) * x[None, :]
    if REDUCE == IN_THREAD:
        prod = tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // RUN, RUN)), axis=2)
    elif REDUCE:
        prod = tl.sum(prod, axis=1)
    return acc + prod


@triton.jit
def total(acc, REDUCE: tl.constexpr):
    """The BN sums of `mac`'s accumulator."""
    if REDUCE != 1:
        acc = tl.sum(acc, axis=1)
    return acc


@triton.jit
def zeros(BN: tl.constexpr, BK: tl.constexpr, REDUCE: tl.constexpr):
    """`mac`'s accumulator for ``REDUCE``: BN × BK, BN, or BN × BK/`RUN`."""
    if REDUCE == IN_THREAD:
        acc = tl.zeros((BN, BK // RUN), dtype=tl.float32)
    elif REDUCE:
        acc = tl.zeros((BN,), dtype=tl.float32)
    else:
        acc = tl.zeros((BN, BK), dtype=tl.float32)
    return acc


@triton.jit
def fp8_gemv_row_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, N, K, HAS_BIAS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    PREFETCH: tl.constexpr, REDUCE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """``out[band] = x · (codes[band] · scale[band])ᵀ (+ bias)`` for one row (`mac`: ``REDUCE`` each step or not).

    With ``PDL`` (programmatic dependent launch, `launch.pdl`) the first K step's weights are loaded before
    the wait for the previous kernel: they do not depend on it, so their read overlaps its tail.
    """
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]
    acc = zeros(BN, BK, REDUCE)
    if PREFETCH:
        pdl_launch(PDL)
        w_next = tl.load(w_ptrs)
        pdl_wait(PDL)
        for k in range(0, K, BK):
            w = w_next
            w_next = tl.load(w_ptrs + (k + BK), mask=(k + BK + rk)[None, :] < K, other=0.0)
            acc = mac(acc, w, tl.load(x_ptr + k + rk).to(tl.float32), REDUCE)
    else:
        if PDL:
            pdl_launch(PDL)
            w = tl.load(w_ptrs)
            pdl_wait(PDL)
            acc = mac(acc, w, tl.load(x_ptr + rk).to(tl.float32), REDUCE)
        for k in range((PDL != 0) * BK, K, BK):
            acc = mac(acc, tl.load(w_ptrs + k), tl.load(x_ptr + k + rk).to(tl.float32), REDUCE)
    y = total(acc, REDUCE) * tl.load(scale_ptr + rn)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn)
    tl.store(out_ptr + rn, y.to(tl.bfloat16))


@triton.jit
def fp8_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """``out[:M, band] (+)= x[:M] · (codes[band] · scale[band])ᵀ (+ bias)`` over this program's K slice."""
    pdl_enter(PDL)  # launched inside `launch.pdl`: wait for the previous kernel before reading x
    band = tl.program_id(0)
    part = tl.program_id(1)
    rn = band * BN + tl.arange(0, BN)
    rm = tl.arange(0, 16)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    span = K // SPLIT_K
    k0 = part * span
    acc = tl.zeros((16, BN), dtype=tl.float32)
    for k in range(k0, k0 + span, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k + rk)[None, :], mask=m_ok[:, None], other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + (k + rk)[None, :])
        if DOT_F32:  # the interpreter (its bf16 dot is wrong): the same numbers, e4m3 → bf16 is exact
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w.to(tl.bfloat16)), acc)
    y = acc * tl.load(scale_ptr + rn)[None, :]
    if HAS_BIAS:  # noqa: SIM102 - a constexpr and a program id do not combine with `and` in Triton
        if part == 0:
            y += tl.load(bias_ptr + rn)[None, :]
    offs = rm[:, None] * N + rn[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=m_ok[:, None])
    else:
        tl.atomic_add(out_ptr + offs, y, mask=m_ok[:, None], sem="relaxed")


def fp8_gemv(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    tile: GemvTile | None = None,
) -> torch.Tensor:
    """``x · (codes · scale)ᵀ + bias`` in bf16 for at most `MAX_ROWS` rows.

    Args:
        x: (M, K) bf16 activations, contiguous, M ≤ 16.
        codes: (N, K) float8_e4m3fn or int8 weight codes, contiguous (a Linear's weight layout).
        scale: (N,) float32 per-output-channel scales.
        bias: (N,) float32, or None.
        tile: the launch configuration (`tuned` by default), fitted to K and N; one row with ``split_k`` 1
            runs the CUDA-core kernel, anything else the tensor-core one.
    """
    m, k = x.shape
    n = codes.shape[0]
    check(m <= MAX_ROWS, f"{m} rows: the GEMV takes at most {MAX_ROWS} (use the GEMM above that)")
    check(x.dtype == torch.bfloat16 and x.is_contiguous(), f"x must be contiguous bf16, not {x.dtype}")
    check(
        codes.dtype in CODES and codes.is_contiguous(),
        f"codes: contiguous (N, K) e4m3 or int8, not {codes.dtype}",
    )
    check(codes.shape[1] == k and k % 16 == 0 and n % 16 == 0, f"codes {tuple(codes.shape)} for K={k}")
    check(scale.shape == (n,) and scale.dtype == torch.float32, "scale: float32 of shape (N,)")
    check(bias is None or (bias.shape == (n,) and bias.dtype == torch.float32), "bias: float32 (N,)")
    t = (tile or tuned(x, codes, scale)).fit(k, n)
    if m == 1 and t.split_k == 1:  # one row: the CUDA-core kernel
        out = torch.empty((1, n), dtype=torch.bfloat16, device=x.device)
        launcher(fp8_gemv_row_kernel, x.device)[(n // t.bn,)](
            x, codes, scale, bias if bias is not None else scale, out, n, k,
            HAS_BIAS=bias is not None, BN=t.bn, BK=t.bk, PREFETCH=t.prefetch, REDUCE=t.reduce_each,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )  # fmt: skip
        return out
    t = dataclasses.replace(t, bn=max(t.bn, 16)).fit(k, n)  # tl.dot takes at least 16 columns
    split = t.split_k > 1
    out = (torch.zeros if split else torch.empty)(
        (m, n), dtype=torch.float32 if split else torch.bfloat16, device=x.device
    )
    launcher(fp8_gemv_kernel, x.device)[(n // t.bn, t.split_k)](
        x, codes, scale, bias if bias is not None else scale, out, m, n, k,
        HAS_BIAS=bias is not None, BN=t.bn, BK=t.bk, SPLIT_K=t.split_k, DOT_F32=x.device.type == "cpu",
        num_warps=t.num_warps, num_stages=t.num_stages,
    )  # fmt: skip
    return out.to(torch.bfloat16) if split else out


def reference(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The same arithmetic in fp32 torch: what the kernel is held to."""
    y = x.float() @ (codes.float() * scale[:, None]).t()
    if bias is not None:
        y = y + bias
    return y.to(torch.bfloat16)


@torch.library.custom_op("deepgap::fp8_gemv", mutates_args=())
def fp8_gemv_op(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, tile: list[int]) -> torch.Tensor:
    """`fp8_gemv` (no bias) as a custom op: torch.compile keeps it one call, a CUDA graph captures it."""
    return fp8_gemv(x, codes, scale, None, GemvTile(*tile) if tile else None)


@fp8_gemv_op.register_fake
def _(x, codes, scale, tile):
    return x.new_empty((x.shape[0], codes.shape[0]), dtype=torch.bfloat16)
