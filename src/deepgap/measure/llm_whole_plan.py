"""The host side of the whole-step decode kernel (`deepgap.measure.llm_whole`): when, with what tiles, and its op.

``DEEPGAP_DECODE_WHOLE=on`` (or ``l2``, ``ahead``: `mode`; ``off`` by default: timed 2.7× slower than the
per-layer step, session 37) gives a quant decoder whose every layer is `llm_fused.FusedLayer` with RoPE folded
in a `WholeStep` (`llm_fused.configure`); its one-sequence steps at a device-side position (the static step a
CUDA graph captures) then run every layer in one launch, and every other call (the prefill, eager steps at an
int position, batches) keeps the per-layer path.

The kernel finds the layers through a table of device pointers, made once per (weights, cache) and kept
(`_scratch`): building it copies host to device, which a CUDA graph capture cannot do, so the step's warm-up
(before the capture) makes it, and a capture that finds none is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton

from deepgap.core import switches
from deepgap.measure import llm_attention, llm_whole
from deepgap.measure.quant import launch
from deepgap.measure.quant.launch import check, halved_to_divide

MODES = switches.choices("DEEPGAP_DECODE_WHOLE")  # off, on
NOTE = "every layer in one kernel"  # what a batch-1 decode row's attention says with it (`llm_attention.describe`)


def mode() -> str:
    """``DEEPGAP_DECODE_WHOLE`` (`MODES`, ``off`` when unset); another value is a usage error.

    ``on``: the whole-step kernel with `DEFAULT_TILES`; ``l2``: each program keeps `LEAD_KB` of its weights
    asked of L2 ahead of its loads, across the barriers too (`Tiles.lead_kb`); ``ahead``: K steps loaded a step
    ahead (`tiles_for`).
    """
    return switches.read("DEEPGAP_DECODE_WHOLE")


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Each GEMV phase's band (BN output channels) and K step (BK); the launch's warps, stages and programs.

    The defaults are the per-layer kernels' tuned one-row tiles on one H200 (session 21: 4 × 4096 bands,
    reduced each step), one program an SM of 16 warps (sm_90 compile over 32 layers: 128 registers a thread,
    16-24 B spilled, once a phase; at 8 warps the attention phase alone took 222 and the kernel 254).
    """

    qkv: tuple[int, int] = (4, 4096)
    o: tuple[int, int] = (4, 4096)
    gate_up: tuple[int, int] = (4, 4096)
    down: tuple[int, int] = (4, 2048)
    warps: int = 16
    ahead: bool = False  # each K step's weights loaded a step ahead (two in flight; at 4096 wide it spills)
    per_sm: int = 1  # at most what fits (`_resident`): 128 registers a thread at 16 warps is one an SM
    lead_kb: int = 0  # KB of its coming weights each program keeps asked of L2 (sm_90; `llm_whole`): 0 none

    def fitted(self, hidden: int, ff: int, heads: int, kv_heads: int, head_dim: int) -> Tiles:
        """BK halved until it divides the phase's K, BN until it divides its outputs (qkv's: half a head)."""

        def fit(t: tuple[int, int], k: int, n: int) -> tuple[int, int]:
            return halved_to_divide(t[0], n, 1), halved_to_divide(t[1], k, 16)

        return dataclasses.replace(
            self,
            qkv=fit(self.qkv, hidden, head_dim // 2),
            o=fit(self.o, heads * head_dim, hidden),
            gate_up=fit(self.gate_up, hidden, ff),
            down=fit(self.down, ff, hidden),
        )

    def as_list(self) -> list[int]:
        """The op's flat form (`decode_whole_op`)."""
        flags = [self.warps, int(self.ahead), self.per_sm, self.lead_kb]
        return [*self.qkv, *self.o, *self.gate_up, *self.down, *flags]

    @classmethod
    def from_list(cls, v: list[int]) -> Tiles:
        """`as_list` read back."""
        return cls((v[0], v[1]), (v[2], v[3]), (v[4], v[5]), (v[6], v[7]), v[8], bool(v[9]), v[10], v[11])


DEFAULT_TILES = Tiles()
# the ``l2`` mode's lead: 132 programs × 64 KB = 8.4 MB asked of L2 at once, a sixth of an H200's 50 MB (o's
# 16 KB bands four ahead, gate_up's 32 KB pairs two, down's 57 KB bands one)
LEAD_KB = 64


def tiles_for(whole: str) -> Tiles:
    """The tiles a `mode` asks for: `DEFAULT_TILES`, with the L2 lead (``l2``), or K steps loaded ahead.

    ``ahead``: 2048-wide K steps, each loaded a step early: the same bytes in flight as one 4096-wide step,
    issued before this step's arithmetic (4096-wide ones loaded ahead spill at 16 warps).
    """
    if whole == "ahead":
        return dataclasses.replace(DEFAULT_TILES, qkv=(4, 2048), o=(4, 2048), gate_up=(4, 2048), ahead=True)
    return dataclasses.replace(DEFAULT_TILES, lead_kb=LEAD_KB if whole == "l2" else 0)


def variant(text: str) -> tuple[str, Tiles]:
    """A benchmark's variant as (mode, tiles): a mode, or a mode with tile fields changed.

    ``l2+lead_kb=128``, ``on+o=8x4096+down=16x2048``: fields joined by ``+``, a band × K step as ``BNxBK``.
    Why here: `benchmarks/whole_decode_phases.py` and `benchmarks/llm_decode_loop.py` time the same variants,
    and a GPU call must not find one unreadable. A `UsageError` names what it cannot read.
    """
    from deepgap.core.errors import UsageError

    mode, *fields = text.split("+")
    if mode not in MODES or mode == "off":
        raise UsageError(f"variant {text!r}: no mode of the one-kernel step", "begin it with on, l2 or ahead")
    known = [f.name for f in dataclasses.fields(Tiles)]
    changes: dict[str, object] = {}
    for field in fields:
        name, _, value = field.partition("=")
        cells = value.split("x")
        width = 2 if isinstance(getattr(DEFAULT_TILES, name, None), tuple) else 1  # BNxBK, or one number
        if name not in known or not all(c.isdigit() for c in cells) or len(cells) != width:
            raise UsageError(
                f"variant {text!r}: {field!r} is not a tile field's NAME=VALUE",
                f"name one of {', '.join(known)}: a band as BNxBK (o=8x4096), the others a number (lead_kb=64)",
            )
        changes[name] = tuple(int(c) for c in cells) if len(cells) == 2 else int(cells[0])
    return mode, dataclasses.replace(tiles_for(mode), **changes)


class WholeStep:
    """A fused quant decoder's layers as one `llm_whole` launch per one-sequence static step.

    Holds each layer's operands in the kernel's table order (`llm_whole.COLUMNS`, the cache's apart), the
    per-channel scales kept so that their pointers stay valid.
    """

    def __init__(self, model, tiles: Tiles | None = None) -> None:
        shape = model.shape
        self.heads, self.eps = shape.heads, shape.rms_eps
        self.layers = list(model.layers)
        self.operands: list[torch.Tensor] = []
        for fused in self.layers:
            lay = fused.layer
            attn = lay.self_attn
            for p in (attn.qkv_proj, attn.o_proj, lay.gate_up_proj, lay.down_proj):
                self.operands += [p.weight_t.t(), p.channel_scales()]
            self.operands += [lay.input_layernorm.weight, lay.post_attention_layernorm.weight]
        t = tiles or DEFAULT_TILES
        self.tiles = t.fitted(shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim)

    def describe(self) -> str:
        """The tiles, as a decode row's ``decode.tiles`` begins with them (before the per-layer GEMVs' own)."""
        t = self.tiles
        tiles = zip(("qkv", "o", "gate_up", "down"), (t.qkv, t.o, t.gate_up, t.down), strict=True)
        bands = ", ".join(f"{name} {bn}x{bk}" for name, (bn, bk) in tiles)
        extra = " ahead" * t.ahead + f" L2 lead {t.lead_kb} KB" * (t.lead_kb > 0)
        return f"one-kernel step: {bands}, {t.warps} warps x {t.per_sm} an SM{extra}; "

    def takes(self, x: torch.Tensor, cache, pos) -> bool:
        """A one-sequence step at a device-side position whose layers all take the fused path."""
        return (
            isinstance(pos, torch.Tensor)
            and cache is not None
            and cache.batch == 1
            and all(layer.takes_fused(x) for layer in self.layers)
        )

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, pos: torch.Tensor):
        """The hidden row after every layer, ``x``'s shape; the cache written at ``pos``."""
        b, s, width = x.shape
        h = decode_whole_op(
            x.reshape(1, width).contiguous(), cos.reshape(-1).contiguous(), sin.reshape(-1).contiguous(),
            pos.reshape(1), self.operands, cache.k, cache.v, self.heads, self.eps, self.tiles.as_list(),
        )  # fmt: skip
        return h.reshape(b, s, width)


@dataclasses.dataclass
class Scratch:
    """One (weights, cache)'s table of pointers and the kernel's scratch, made once (`_scratch`)."""

    table: torch.Tensor  # int64 (layers, NF)
    ws: torch.Tensor  # the attention's fp32 partials
    counts: torch.Tensor  # int32: NKV merge counts, then the barrier's counter, exit count and error flag
    rows: torch.Tensor  # bf16: q, the attention's row, the MLP's row
    split: llm_attention.Split


_SCRATCH: dict[tuple, Scratch] = {}


def _scratch(
    operands: list[torch.Tensor], ks: list[torch.Tensor], vs: list[torch.Tensor], heads: int, ff: int
):
    # the cache's shape too: a new cache at a freed one's address may be shorter (another split, another ws)
    key = (tuple(t.data_ptr() for t in (*operands, *ks, *vs)), tuple(ks[0].shape), heads, ff)
    if key in _SCRATCH:
        return _SCRATCH[key]
    dev = ks[0].device
    check(
        dev.type != "cuda" or not torch.cuda.is_current_stream_capturing(),
        "the whole-step decode kernel's table is made before a CUDA graph captures it: run the step once first",
    )
    per = len(operands) // len(ks)
    ptrs = [[t.data_ptr() for t in operands[i * per : (i + 1) * per]] + [k.data_ptr(), v.data_ptr()]
            for i, (k, v) in enumerate(zip(ks, vs, strict=True))]  # fmt: skip
    _, nkv, length, d = ks[0].shape
    sms = llm_attention.device_sms(dev)
    split = llm_attention.plan(1, nkv, length, sms, "on")
    if not split.combine:
        split = llm_attention.chunked(length, 1)
    rows = heads * split.chunks
    made = Scratch(
        table=torch.tensor(ptrs, dtype=torch.int64, device=dev),
        ws=torch.empty(rows * (d + 2), dtype=torch.float32, device=dev),
        counts=torch.zeros(nkv + 3, dtype=torch.int32, device=dev),
        rows=torch.empty(2 * heads * d + ff, dtype=torch.bfloat16, device=dev),
        split=split,
    )
    _SCRATCH[key] = made
    return made


def run(x, cos, sin, pos, operands, ks, vs, heads: int, eps: float, tiles: Tiles, times=None) -> torch.Tensor:
    """`llm_whole.whole_decode_kernel` over every layer (`decode_whole_op`'s body); the hidden row ``(1, H)``.

    ``times``: int64 of 1 + 5 × layers, the global timer (ns) at the start and after each barrier (a GPU's).
    """
    hidden = x.shape[1]
    ff = operands[6].shape[1]  # down's K
    nkv, length, d = ks[0].shape[1], ks[0].shape[2], ks[0].shape[3]
    check(x.dtype == torch.bfloat16 and x.shape[0] == 1, "x: one bf16 row")
    check(
        all(k.shape == (1, nkv, length, d) and k.is_contiguous() for k in (*ks, *vs)),
        "the cache: one sequence",
    )
    check(heads % nkv == 0 and heads // nkv <= llm_attention.ROWS, f"{heads} query heads over {nkv} KV heads")
    llm_attention.check_head_dim(d)
    s = _scratch(operands, ks, vs, heads, ff)
    q, a, mid = s.rows[: heads * d], s.rows[heads * d : 2 * heads * d], s.rows[2 * heads * d :]
    h = torch.empty_like(x)
    cuda = x.device.type != "cpu"  # a GPU (or meta tensors: `benchmarks/compile_sm90.py` compiles for one)
    programs = llm_attention.device_sms(x.device) * tiles.per_sm if cuda else 1
    t = tiles
    grid = llm_whole.launch(x.device, programs)
    if x.is_cuda:
        grid = _resident(grid, programs, tiles)
    grid(
        x, h, s.table, cos, sin, pos, q, a, mid, s.ws, s.counts, s.counts[nkv:],
        len(ks), hidden, ff, heads, nkv, length, s.split.chunk, s.split.chunks, eps, 1.0 / math.sqrt(d),
        D=d, GQ=heads // nkv, INT8=operands[0].dtype == torch.int8, BN_QKV=t.qkv[0], BK_QKV=t.qkv[1],
        BN_O=t.o[0], BK_O=t.o[1], BN_GU=t.gate_up[0], BK_GU=t.gate_up[1], BN_DN=t.down[0], BK_DN=t.down[1],
        AHEAD=t.ahead, ONE=_one_step(t, hidden, heads * d, ff), BL=s.split.block,
        SP=max(2, triton.next_power_of_2(s.split.chunks)), BARRIER=int(cuda), FENCE=cuda,
        LEAD_KB=t.lead_kb if cuda else 0, DOT_F32=not cuda, num_warps=t.warps, num_stages=1,
        **({} if times is None else {"times_ptr": times, "TIMES": True}),
    )  # fmt: skip
    return h


class _resident:  # noqa: N801 - stands in for ``kernel[grid]``
    """``kernel[grid]`` whose first call compiles (``warmup``) and refuses a grid that cannot all be resident.

    Why: a grid barrier waits for every program; programs that do not fit on the SMs at once never arrive, and
    each barrier would spin to its limit and flag the error. From ptxas's registers and the shared memory.
    """

    def __init__(self, grid, programs: int, tiles: Tiles) -> None:
        self.grid, self.programs, self.tiles = grid, programs, tiles

    checked: set[tuple] = set()  # (device, programs, tiles) that fit

    def __call__(self, *args, **kw):
        key = (torch.cuda.current_device(), self.programs, self.tiles)
        if key not in self.checked:
            self._check(args, kw | (launch.PDL_KWARGS if launch.pdl_on() else {}))  # what the launch compiles
            self.checked.add(key)
        return self.grid(*args, **kw)

    def _check(self, args, kw) -> None:
        compiled = llm_whole.whole_decode_kernel.warmup(*args, grid=(self.programs,), **kw)
        compiled._init_handles()  # noqa: SLF001 - loading the cubin is what sets n_regs (Triton 3.6 and 3.8)
        regs, shared = compiled.n_regs, compiled.metadata.shared
        n = per_sm_fit(regs, shared, self.tiles.warps)
        check(
            n >= self.tiles.per_sm,
            f"{self.tiles.per_sm} programs an SM of the whole-step kernel: {regs} registers a thread and "
            f"{shared} B of shared memory fit {n}; ask for fewer",
        )


def per_sm_fit(regs: int, shared: int, warps: int) -> int:
    """Programs of ``warps`` warps that fit on one Hopper SM at once.

    An SM holds 64K registers (allocated 8 a thread at a time, per warp), 227 KB of shared memory, 64 warps.
    """
    per_program = -(-regs // 8) * 8 * 32 * warps
    return min(65536 // per_program, (227 << 10) // max(1, shared), 64 // warps)


def _one_step(t: Tiles, hidden: int, attn: int, ff: int) -> int:
    """The kernel's ``ONE``: a bit for each GEMV phase whose K is one step of its tile (qkv, o, gate_up, down).

    qkv's too since session 36: session 35 left it out for a 4 B spill, measured on a one-layer compile (no
    layer loop); over 32 layers, with the loop's hoisting off, it spills less with it than without (sm_90,
    Triton 3.6: 24 B against 32 under PDL). Without it each of qkv's 32 KB band pairs re-reads and
    re-normalises x and γ, 16 KB more.
    """
    ks = ((t.qkv[1], hidden), (t.o[1], attn), (t.gate_up[1], hidden), (t.down[1], ff))
    return sum(1 << i for i, (bk, k) in enumerate(ks) if bk == k)


def flagged(ks: list[torch.Tensor]) -> bool:
    """Whether a wait of a launch over these caches gave up (its programs were not all resident): wrong rows."""
    first = ks[0].data_ptr()
    return any(int(s.counts[-1]) != 0 for key, s in _SCRATCH.items() if first in key[0])


def reset_counters() -> None:
    """Every kept scratch's barrier counters and error flag back to zero.

    For `benchmarks/whole_decode_phases.py`, whose variants share one scratch: a wait that gave up leaves the
    flag set and may leave the counter short of zero, which the next variant's launch must not inherit.
    """
    with torch.inference_mode():  # a scratch made in a step's inference mode is an inference tensor
        for s in _SCRATCH.values():
            s.counts.zero_()


def refuse_if_flagged(model) -> None:
    """After a decode measurement: a `StatusError` (error) where its one-kernel step's waits gave up.

    Why: the kernel flags the error rather than hang, so its rows, and the tokens and times measured from
    them, are not to be stored as if they were true.
    """
    from deepgap.core.records import Status
    from deepgap.measure.protocol import StatusError

    cache = getattr(model, "cache", None)
    if getattr(model, "whole_step", None) is not None and cache is not None and flagged(cache.k):
        raise StatusError(
            Status.ERROR,
            "the one-kernel decode step's grid barrier gave up waiting (its programs were not all resident on "
            "the GPU), so its tokens are wrong; run without DEEPGAP_DECODE_WHOLE",
        )


@torch.library.custom_op("deepgap::decode_whole", mutates_args=("ks", "vs"))
def decode_whole_op(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    operands: list[torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    heads: int,
    eps: float,
    tiles: list[int],
) -> torch.Tensor:
    """`run` as a custom op: torch.compile keeps it one call, a CUDA graph captures it; K and V written."""
    return run(x, cos, sin, pos, operands, ks, vs, heads, eps, Tiles.from_list(tiles))


@decode_whole_op.register_fake
def _(x, cos, sin, pos, operands, ks, vs, heads, eps, tiles):
    return torch.empty_like(x)
