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
- **The norm handed over** (``handed`` in the reader, ``hand`` in the row's writer: `norm_handoff`, the default
  in `deepgap.measure.llm_fused`): the writer stores the row ⊙ γ and its square sums, the reader only the root.
- **RoPE** (``rope``, `RopeWrite`, the qkv projection at batch 1): a program takes a head's channels in pairs
  (rows ``c`` and ``c + head_dim/2``, as SwiGLU pairs its rows), rotates q and k heads (HF's half split) and
  writes q to its output, k and v into the static K/V cache at the step's device position: RoPE's and the
  cache write's kernels go (`deepgap.measure.llm_fused`, ``DEEPGAP_DECODE_ROPE=fused``).

Arithmetic is fp32 from the loads to the store (HF rounds the normalized row and each projection to bf16 in
between; `reference` is held to the same fp32 order). The tile is timed per (variant, K, N) as the plain GEMV's
(`gemv.fastest`). On CPU tensors the kernel runs in Triton's interpreter, as the tests do.
"""

# ruff: noqa: N803

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from deepgap.core import switches
from deepgap.measure.quant import gemv, launch, norm_handoff, step_tiles
from deepgap.measure.quant.gdc import pdl_launch, pdl_wait
from deepgap.measure.quant.gemv import FUSED_TILES
from deepgap.measure.quant.launch import check, launcher
from deepgap.measure.quant.rope_store import RopeWrite, check_rope, rope_angles, rope_kv, rope_q, rope_store


@triton.jit
def fused_step(
    acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, k, rk,
    NORM: tl.constexpr, PAIRED: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """One K step of `fused_row_kernel` on loaded weights: x's slice, its squares, products."""
    x = tl.load(x_ptr + k + rk).to(tl.float32)
    if NORM:
        squares += x * x
        x = x * tl.load(gamma_ptr + k + rk).to(tl.float32)
    acc = gemv.mac(acc, w, x, REDUCE)
    if PAIRED:  # the second row of the pair (SwiGLU's up row, RoPE's other half of the head)
        acc_up = gemv.mac(acc_up, w_up, x, REDUCE)
    return acc, acc_up, squares


@triton.jit
def band(w_ptrs, apart, k, PAIRED: tl.constexpr):
    """A program's weights for the K step at ``k``: its rows, and with ``PAIRED`` the pair's second rows.

    With ``w_ptrs`` = the scales at the band's rows, ``apart`` = the pair's distance and ``k`` = 0: the band's
    per-channel scales (the first row's again without ``PAIRED``).
    """
    w = tl.load(w_ptrs + k)
    w_up = w
    if PAIRED:
        w_up = tl.load(w_ptrs + apart + k)
    return w, w_up


@triton.jit
def fused_row_kernel(
    x_ptr, w_ptr, scale_ptr, gamma_ptr, res_ptr, out_ptr, NO, K, eps,
    NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    REDUCE: tl.constexpr = False, PDL: tl.constexpr = False,
    cos_ptr=None, sin_ptr=None, pos_ptr=None, k_ptr=None, v_ptr=None, L=1, NQ=0, NKV=0, ROPE: tl.constexpr = False,
    D: tl.constexpr = 2, sums_ptr=None, PARTS: tl.constexpr = 1,
    HANDED: tl.constexpr = False, hand_gamma_ptr=None, scaled_ptr=None, hand_sums_ptr=None, HAND: tl.constexpr = False,
    RNE: tl.constexpr = False, PRE: tl.constexpr = 0, AHEAD: tl.constexpr = False,
):  # fmt: skip
    """``out[band]`` of one row: an optional RMSNorm of x, the product, then SwiGLU, a residual add or RoPE.

    Output channel ``n`` of a pair is weight rows ``n`` and ``n + NO`` with SwiGLU; with ``ROPE`` pair ``n`` of
    head ``h = n // (D/2)`` is rows ``h·D + c`` and ``h·D + c + D/2`` (``c = n mod D/2``), `rope_store`.
    With ``PDL`` the first ``PRE`` K steps' weights are read before the wait for the previous kernel (`gemv`'s row
    kernel reads one; 0: none, the whole program after the wait); ``PRE`` is the tile's ``ahead`` wherever launches
    use PDL (on the CPU inside `launch.pdl` the same steps run peeled without the wait, as the tests check), else 0.
    ``HANDED``: x is a row ⊙ γ whose norm a writer handed over, its sums read at the end (read right after PDL's
    wait alone, the scales still at the end, they were never faster: session 39 on one H100, 40 on one H200; with
    ``AHEAD`` they are, beside the rest); ``HAND``: this one hands the
    next norm over (`norm_handoff`). ``AHEAD`` (under PDL, `launch.constants_ahead`): the band's scales, which no
    kernel writes, and the next norm's γ (``HAND``) load before the wait; the residual, the handed sums and RoPE's
    angles and position right after it: nothing is left to load after the K loop.
    """
    paired: tl.constexpr = SWIGLU or ROPE  # two rows a channel: SwiGLU's gate and up, RoPE's two halves
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = rows_first(rn, D, ROPE)
    second = NO  # the pair's second row, this many rows further
    if ROPE:
        second = D // 2
    apart = second * K
    rk = tl.arange(0, BK)
    w_ptrs = w_ptr + rows[:, None] * K + rk[None, :]
    # `gemv.mac`: BN sums, a BN × BK block reduced at the end, or BN × BK/16 sums
    acc = gemv.zeros(BN, BK, REDUCE)
    acc_up = acc
    squares = tl.zeros((BK,), dtype=tl.float32)
    root = 1.0
    # the weights do not depend on the previous kernel: with PDL the first PRE steps' are in flight before the wait
    pdl_launch(PDL)
    if AHEAD:
        s, s_up = band(scale_ptr + rows, second, 0, paired)
        if HAND:
            g = norm_handoff.band_gamma(tl.program_id(0) * BN, hand_gamma_ptr, BN)
    w, w_up, w1, w1_up = 0.0, 0.0, 0.0, 0.0  # the steps loaded ahead of the wait (none: PRE = 0)
    if PRE >= 1:
        w, w_up = band(w_ptrs, apart, 0, paired)
    if PRE >= 2:
        w1, w1_up = band(w_ptrs, apart, BK, paired)
    pdl_wait(PDL)
    r = 0.0
    if AHEAD:  # what the previous kernels wrote, in flight during the K loop
        if RESIDUAL:
            r = tl.load(res_ptr + rn).to(tl.float32)
        if HANDED:
            root = norm_handoff.handed_root(sums_ptr, K, eps, PARTS)
        if ROPE:
            cos, cos2, sin, sin2 = rope_angles(rn, cos_ptr, sin_ptr, D)
            pos = tl.load(pos_ptr)
    acc, acc_up, squares = walk(
        acc, acc_up, squares, w, w_up, w1, w1_up, w_ptrs, apart, x_ptr, gamma_ptr, K, rk, BK, PRE, NORM, paired, REDUCE
    )  # fmt: skip
    if NORM:
        root = folded_root(squares, K, eps)
    if not AHEAD:
        if HANDED:
            root = norm_handoff.handed_root(sums_ptr, K, eps, PARTS)
        s, s_up = band(scale_ptr + rows, second, 0, paired)
        if RESIDUAL:
            r = tl.load(res_ptr + rn).to(tl.float32)
    y, up = finish(acc, acc_up, root, rn, s, s_up, r, out_ptr, SWIGLU, RESIDUAL, ROPE, REDUCE)
    if ROPE:
        if AHEAD:
            q, q2 = rope_q(y, up, rn, cos, cos2, sin, sin2, out_ptr, NQ, NKV, D)
            rope_kv(q, q2, rn, pos, k_ptr, v_ptr, L, NQ, NKV, D, RNE)
        else:
            rope_store(y, up, rn, out_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, L, NQ, NKV, D, RNE)
    if HAND:
        if not AHEAD:
            g = norm_handoff.band_gamma(tl.program_id(0) * BN, hand_gamma_ptr, BN)
        norm_handoff.hand_off(y, tl.program_id(0) * BN, g, scaled_ptr, hand_sums_ptr, BN)


@triton.jit
def walk(
    acc, acc_up, squares, w, w_up, w1, w1_up, w_ptrs, apart, x_ptr, gamma_ptr, K, rk, BK: tl.constexpr,
    PRE: tl.constexpr, NORM: tl.constexpr, PAIRED: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """`fused_row_kernel`'s K loop: the ``PRE`` steps whose weights (``w``, ``w1``) loaded before the wait, the rest."""
    if PRE >= 1:
        acc, acc_up, squares = fused_step(
            acc, acc_up, squares, w, w_up, x_ptr, gamma_ptr, 0, rk, NORM, PAIRED, REDUCE
        )
    if PRE >= 2:
        acc, acc_up, squares = fused_step(
            acc, acc_up, squares, w1, w1_up, x_ptr, gamma_ptr, BK, rk, NORM, PAIRED, REDUCE
        )
    for k in range(PRE * BK, K, BK):
        wk, wk_up = band(w_ptrs, apart, k, PAIRED)
        acc, acc_up, squares = fused_step(
            acc, acc_up, squares, wk, wk_up, x_ptr, gamma_ptr, k, rk, NORM, PAIRED, REDUCE
        )
    return acc, acc_up, squares


@triton.jit
def finish(
    acc, acc_up, root, rn, s, s_up, r, out_ptr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, ROPE: tl.constexpr,
    REDUCE: tl.constexpr,
):  # fmt: skip
    """A band's epilogue (scales ``s`` and ``s_up``, the norm's root, SwiGLU, the residual ``r``), stored but RoPE's.

    ``root``: the norm's ``rsqrt(mean(x²) + eps)``, or 1. Returns the band's fp32 row as stored (not RoPE's
    rotated one, which the caller writes, `rope_store`) and the pair's second row (RoPE's other half).
    """
    y = gemv.total(acc, REDUCE) * s * root
    up = y
    if SWIGLU or ROPE:
        up = gemv.total(acc_up, REDUCE) * s_up * root
    if SWIGLU:
        y = y * tl.sigmoid(y) * up
    if RESIDUAL:
        y += r
    if not ROPE:
        tl.store(out_ptr + rn, y.to(tl.bfloat16))
    return y, up


@triton.jit
def folded_root(squares, K, eps):
    """The folded norm's ``rsqrt(mean(x²) + eps)`` from a program's squares of the whole row (fp32, BK wide)."""
    return tl.rsqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def rows_first(r0, D: tl.constexpr, ROPE: tl.constexpr):
    """The weight row of output channel(s) ``r0``: itself, or with RoPE its head's row ``c`` (`RopeWrite`)."""
    if ROPE:
        return (r0 // (D // 2)) * D + r0 % (D // 2)
    return r0


# qkv's tile at one row (RoPE in its epilogue), untimed unless ``DEEPGAP_DECODE_QKV_TILE=tuned``, is the first. Why
# not timed: the tuner ranks a tile by 20 calls of it alone in a graph, and for qkv that ranking is not the step's. One
# H200 (session 61, 8B fp8, batch 1, the step in the bare loop, six processes): the tuner's `8x512 st4` 2.2304-2.2312
# ms a step, gate_up's in-thread `4x2048` 2.1894-2.1914, in-thread `4x1024` 2.1785-2.1800 (+2.4%; docs/llm.md). All
# three are offered to every fused GEMV where the step times its tiles (`step_tiles`): `8x1024` ran qkv within 0.5%.
STEP_TILES = tuple(
    gemv.GemvTile(bn, bk, 1, w, 1, 0, gemv.IN_THREAD.value)
    for bn, bk, w in [(4, 1024, 4), (8, 1024, 4), (16, 2048, 8)]
)
QKV_TILE = STEP_TILES[0]


def qkv_pinned() -> bool:
    """Whether qkv takes `QKV_TILE` untimed: ``DEEPGAP_DECODE_QKV_TILE=pinned`` (the default), no `step_tiles`."""
    return switches.read("DEEPGAP_DECODE_QKV_TILE") == "pinned" and not step_tiles.on()


@dataclasses.dataclass(frozen=True)
class Fusion:
    """What one fused call folds in: a norm's scale and eps, SwiGLU, a residual row, RoPE (module docstring).

    Or the norm handed over (`norm_handoff`): ``handed``, the ``(K / GROUP,)`` square sums of the row whose
    ⊙ γ is x (with ``eps``, no ``gamma``); ``hand``, the next norm's buffers this call writes as well.
    """

    gamma: torch.Tensor | None = None
    eps: float = 0.0
    swiglu: bool = False
    residual: torch.Tensor | None = None
    rope: RopeWrite | None = None
    handed: torch.Tensor | None = None
    hand: norm_handoff.HandOff | None = None

    def key(self) -> tuple:
        """The variant, for the tile's timing (the kernel's constexprs)."""
        folds = (self.residual, self.rope, self.handed, self.hand)
        return (self.gamma is not None, self.swiglu, *(f is not None for f in folds))

    def tiles(self) -> tuple[gemv.GemvTile, ...]:
        """The tuner's candidates: `FUSED_TILES`, and the capped `gemv.NORM_TILES` where the norm is folded.

        A writer that hands a norm over takes bands of whole `norm_handoff.GROUP`s. qkv (RoPE in the epilogue) takes
        `QKV_TILE` alone unless ``DEEPGAP_DECODE_QKV_TILE=tuned`` (its docstring has why).
        """
        if self.rope is not None and qkv_pinned():
            return (QKV_TILE,)
        tiles = FUSED_TILES + gemv.NORM_TILES * (self.gamma is not None)
        tiles += STEP_TILES * step_tiles.on()
        return tuple(t for t in tiles if self.hand is None or t.bn % norm_handoff.GROUP.value == 0)


def fused_gemv(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    fusion: Fusion,
    tile: gemv.GemvTile | None = None,
) -> torch.Tensor:
    """One row ``x (1, K)`` bf16 through 8-bit ``codes (N, K)`` with per-channel ``scale (N,)``, as ``fusion`` says.

    Returns ``(1, N)`` bf16, or ``(1, N/2)`` with SwiGLU; with RoPE the rotated q ``(1, heads · head_dim)``,
    k and v written into the cache. ``gamma``: the norm's (K,) scale; ``residual``: ``(1, N)`` bf16, added
    after the product.
    """
    no = checked(x, codes, scale, fusion)
    t = (tile or _tuned(x, codes, scale, fusion)).fit(x.shape[1], no)
    r = fusion.rope
    out = torch.empty((1, r.heads * r.k.shape[3] if r else no), dtype=torch.bfloat16, device=x.device)
    _launch_row(x, codes, scale, fusion, t, out)
    return out


def checked(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion) -> int:
    """The operands of `fused_gemv` checked (a ValueError names the first wrong one); the programs' width."""
    m, k = x.shape
    n = codes.shape[0]
    no = _programs_width(n, fusion)
    check(m == 1 and x.dtype == torch.bfloat16 and x.is_contiguous(), "x: one contiguous bf16 row")
    check(
        codes.dtype in gemv.CODES and codes.is_contiguous() and codes.shape[1] == k and k % 16 == 0,
        f"codes {tuple(codes.shape)}: contiguous (N, K) e4m3 or int8 for K={k}",
    )
    check(scale.shape == (n,) and scale.dtype == torch.float32, "scale: float32 of shape (N,)")
    check(no % 16 == 0, f"N={n}: the output width must be a multiple of 16 (of 32 with SwiGLU)")
    check(fusion.gamma is None or fusion.gamma.shape == (k,), f"gamma: the norm's scale of shape ({k},)")
    check(fusion.residual is None or fusion.residual.numel() == no, f"residual: one row of {no}")
    if fusion.rope is not None:
        check_rope(fusion.rope, n)
    if fusion.handed is not None:
        norm_handoff.check_handed(fusion.handed, k, fusion.gamma)
    if fusion.hand is not None:
        fusion.hand.check(no, fusion.swiglu or fusion.rope is not None)
    return no


def _launch_row(x, codes, scale, fusion: Fusion, t: gemv.GemvTile, out) -> None:
    """`fused_row_kernel` over the row's ``width / BN`` programs."""
    k, no = x.shape[1], _programs_width(codes.shape[0], fusion)
    r = fusion.rope
    rope = {}
    if r is not None:
        rope = dict(cos_ptr=r.cos, sin_ptr=r.sin, pos_ptr=r.pos, k_ptr=r.k, v_ptr=r.v, L=r.k.shape[2])
        rope |= dict(NQ=r.heads, NKV=r.k.shape[1], ROPE=True, D=r.k.shape[3])
        if r.k.dtype != torch.bfloat16 and x.device.type == "cpu":  # fp8 codes in the interpreter: `e4m3_rne`
            rope["RNE"] = True
    h, extra = fusion.hand, {}
    if fusion.handed is not None:
        extra |= dict(sums_ptr=fusion.handed, PARTS=norm_handoff.parts_block(k), HANDED=True)
    if h is not None:
        extra |= dict(hand_gamma_ptr=h.gamma, scaled_ptr=h.scaled, hand_sums_ptr=h.squares, HAND=True)
    launcher(fused_row_kernel, x.device)[(no // t.bn,)](
        x, codes, scale,
        fusion.gamma if fusion.gamma is not None else scale,
        fusion.residual if fusion.residual is not None else x,
        out, no, k, fusion.eps,
        NORM=fusion.gamma is not None, SWIGLU=fusion.swiglu, RESIDUAL=fusion.residual is not None,
        BN=t.bn, BK=t.bk, REDUCE=t.reduce_each, PRE=t.ahead if launch.pdl_on() else 0,
        AHEAD=launch.constants_ahead(),
        num_warps=t.num_warps, num_stages=t.num_stages, **rope,
        **({"maxnreg": t.maxnreg} if t.maxnreg and x.device.type != "cpu" else {}),
        **extra,
    )  # fmt: skip


def _programs_width(n: int, fusion: Fusion) -> int:
    """The output channels the programs split: N, or N/2 where each takes a pair of rows (SwiGLU, RoPE)."""
    return n // 2 if fusion.swiglu or fusion.rope is not None else n


def _tuned(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion) -> gemv.GemvTile:
    """The fastest of the variant's candidates (`Fusion.tiles`) at this shape (`gemv.fastest`)."""
    k, n = x.shape[1], codes.shape[0]
    no = _programs_width(n, fusion)
    key, cands = ("fused", fusion.key(), k, n, str(x.device)), fusion.tiles()
    if cands == (QKV_TILE,):  # pinned: `gemv.chosen` says so where the step runs it
        gemv.PINNED[key] = QKV_TILE.fit(k, no)
    if step_tiles.on():  # for a search in the step's graph
        step_tiles.record(key, (c.fit(k, no) for c in cands))
    call = lambda t, w: fused_gemv(x, w, scale, fusion, t)  # noqa: E731 - the candidate on matrix w
    return gemv.fastest(key, x.device, (c.fit(k, no) for c in cands), call, decode=True, weights=codes)


def tiles_in_step(timer) -> None:
    """`step_tiles.search` over the tuner's table: ``timer()`` times the decode step with the tiles it holds now."""
    step_tiles.search(timer, gemv._TUNED)


def reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, fusion: Fusion) -> torch.Tensor:
    """The same arithmetic in fp32 torch: what the kernel is held to."""
    xf = x.float()
    root = 1.0
    if fusion.gamma is not None:
        root = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + fusion.eps)
        xf = xf * fusion.gamma.float()
    if fusion.handed is not None:
        root = torch.rsqrt(fusion.handed.sum() / x.shape[1] + fusion.eps)
    y = (xf @ (codes.float() * scale[:, None]).t()) * root
    if fusion.swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    if fusion.rope is not None:
        return _rope_reference(y, fusion.rope)
    if fusion.residual is not None:
        y = y + fusion.residual.float().reshape(y.shape)
    if fusion.hand is not None:  # the buffers the kernel writes, as `norm_handoff.reference` gives them
        scaled, squares = norm_handoff.reference(y.to(torch.bfloat16), fusion.hand.gamma)
        fusion.hand.scaled.copy_(scaled)
        fusion.hand.squares.copy_(squares)
    return y.to(torch.bfloat16)


def _rope_reference(y: torch.Tensor, r: RopeWrite) -> torch.Tensor:
    """`reference`'s RoPE in fp32: q and k heads rotated (HF's half split), k and v into the cache at ``pos``."""
    nkv, d = r.k.shape[1], r.k.shape[3]
    heads = y.reshape(-1, d)
    half = d // 2
    rotated = heads * r.cos.float().reshape(d) + torch.cat((-heads[:, half:], heads[:, :half]), -1) * (
        r.sin.float().reshape(d)
    )
    heads = torch.cat((rotated[: r.heads + nkv], heads[r.heads + nkv :])).to(torch.bfloat16)
    p = int(r.pos)
    r.k[0, :, p] = heads[r.heads : r.heads + nkv]
    r.v[0, :, p] = heads[r.heads + nkv :]
    return heads[: r.heads].reshape(1, -1)
