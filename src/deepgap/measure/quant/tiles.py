"""The layer plan: tile configurations, activation formats, and the per-layer quantized-vs-fp16 choice.

Why per layer: a fused 8-bit kernel wins in the early, memory-bound layers (half the bytes, one
pass) but a plain kernel can lose to cuBLAS/cuDNN fp16 in the late, compute-bound ones (docs/quant.md,
the quant engine, has the measured numbers). So each convolution is timed both ways at prepare time
and keeps the faster; the choice and both times are recorded in ``Prepared.info``.

Everything here is pure (no GPU): the timing itself lives in ``engine.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from deepgap.core import switches
from deepgap.measure.quant.fold import ConvertNode, ConvNode, Graph, HeadNode, PoolNode
from deepgap.measure.quant.launch import halved_to_divide

SMEM_BUDGET_BYTES = 200 * 1024  # of the H100's 227 KB per block, leaving room for the epilogue
SMS_H100 = 132
SMALL_BATCH_ENV = "DEEPGAP_QUANT_SMALL_BATCH"
GEMM_ENV = "DEEPGAP_QUANT_GEMM"
GEMM_MODES = switches.choices(GEMM_ENV)  # persistent, narrow, off


@dataclass(frozen=True)
class TileConfig:
    """One tile of the grouped GEMM kernels (`conv_gemm_kernel`, `linear_kernels.fp8_linear_kernel`).

    Block sizes in elements, the row-tile group, warps and pipeline stages: the six numbers both kernels
    take; ``early_res`` is the convolution's alone (the Linear has no residual). A nonzero ``persistent``
    makes it a tile of the persistent TMA kernel for 1×1 layers instead (`quant.persistent`, offered unless
    ``DEEPGAP_QUANT_GEMM=off``), which also reads ``tma_epilogue``.
    """

    bm: int
    bn: int
    bk: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    early_res: bool = False  # the residual loaded before the K loop (persistent: a tile ahead)
    # programs per SM of the persistent TMA kernel (quant.persistent; 1×1 stride-1 layers); 0: the grouped one
    persistent: int = 0
    tma_epilogue: bool = False  # persistent only: the residual and the output through TMA descriptors too
    # persistent kernels only (the Linear's, the 1×1 convolution's): the epilogue in two column halves
    split_epilogue: bool = False
    split_k: int = 1  # the grouped convolution only: programs per tile, each a slice of K (`quant.split_k`)
    tma_conv: int = 0  # > 0: a tile of the TMA-fed 3×3 convolution (`quant.conv_tma`), its block this wide
    spread: bool = False  # split-K only: every slice's program sums a band of the tile (`split_k.spread_sum`)

    @property
    def label(self) -> str:
        """Short text form, e.g. '128x256x128 w8 s3' ('… er' early residual, '… persistent[x2] [tma-epi]').

        A split-K tile ends in '… split8' (`quant.split_k`), '… split8 spread' where the slices share the sum.
        """
        extra = " er" if self.early_res else ""
        if self.persistent:
            extra += " persistent" + (f"x{self.persistent}" if self.persistent > 1 else "")
            extra += " tma-epi" if self.tma_epilogue else ""
            extra += " split-epi" if self.split_epilogue else ""
        extra += f" split{self.split_k}" if self.split_k > 1 else ""
        extra += " spread" if self.spread else ""
        extra += f" tma-conv{self.bm // self.tma_conv}x{self.tma_conv}" if self.tma_conv else ""
        return f"{self.bm}x{self.bn}x{self.bk} w{self.num_warps} s{self.num_stages}{extra}"

    def launch(self) -> dict[str, int]:
        """The six numbers as both kernels' launches take them: constexpr BM, BN, BK, GROUP_M; warps, stages."""
        blocks = {f.upper(): getattr(self, f) for f in ("bm", "bn", "bk", "group_m")}
        return {**blocks, "num_warps": self.num_warps, "num_stages": self.num_stages}

    def fields(self) -> list[int]:
        """Every field as an int, in order: a torch custom op's ``list[int]`` argument (`from_fields` reads it)."""
        return [int(v) for v in dataclasses.astuple(self)]

    @classmethod
    def from_fields(cls, values) -> TileConfig:
        """The tile `fields` wrote (a shorter list leaves the later fields at their defaults)."""
        kinds = [isinstance(f.default, bool) for f in dataclasses.fields(cls)]
        return cls(*(bool(v) if b else int(v) for v, b in zip(values, kinds, strict=False)))

    def fit(self, k: int, n: int) -> TileConfig:
        """This tile with BK and BN halved until they divide ``k`` and ``n`` (multiples of 16)."""
        return dataclasses.replace(
            self, bk=halved_to_divide(self.bk, k, 16), bn=halved_to_divide(self.bn, n, 16)
        )

    def smem_bytes(self, elem_bytes: int = 1) -> int:
        """Shared memory of the software pipeline: stages × (A tile + B tile) (+ the TMA epilogue's tiles).

        A TMA epilogue stages the output and the residual tile in shared memory, counted at 2 bytes each
        (fp16, the widest either is in a network); half the tile where the epilogue is split.
        """
        epi = 2 * self.bm * self.bn * 2 // (2 if self.split_epilogue else 1) if self.tma_epilogue else 0
        return self.num_stages * (self.bm + self.bn) * self.bk * elem_bytes + epi

    def fits(self, n: int, c: int) -> bool:
        """Whether the tile divides C_out and C_in as the kernel requires, within the smem budget.

        A persistent tile's programs per SM share the budget: one that did not fit would wait for the
        other to walk all its tiles before it started.
        """
        smem = self.smem_bytes() * max(1, self.persistent)
        return n % self.bn == 0 and c % self.bk == 0 and smem <= SMEM_BUDGET_BYTES


def candidate_configs(
    m: int, n: int, c: int, qfmt: str = "int8", has_res: bool = False, sms: int = SMS_H100, limit: int = 3
) -> list[TileConfig]:
    """Tile configurations worth timing for a GEMM of M×N with C_in input channels (8-bit operands).

    The first is the heuristic default: 128-row tiles as wide as C_out allows (up to 256, two
    warpgroups) with 128-byte K steps, as in Triton's Hopper fp8 GEMM; when that leaves fewer than
    two waves of tiles (small batches, late layers) 64-row tiles are added. An epilogue with a
    residual holds the accumulator, its fp32 copy and the residual at once: compiled for sm_90
    (Triton 3.6) an int8 (or fp16-residual) one spills beyond 64 accumulators per thread, so
    residual layers get at most 128-wide tiles on 8 warps.
    """
    bk = 128 if c % 128 == 0 else 64 if c % 64 == 0 else 32 if c % 32 == 0 else 16
    out: list[TileConfig] = []
    if n % 256 == 0:
        out += [TileConfig(128, 256, bk, 8, 8, 3), TileConfig(128, 128, bk, 8, 8, 4)]
    elif n % 128 == 0:
        out += [TileConfig(128, 128, bk, 8, 8, 4), TileConfig(128, 128, bk, 8, 4, 4)]
    elif n % 64 == 0:
        out += [TileConfig(128, 64, bk, 8, 4, 4), TileConfig(256, 64, bk, 8, 8, 3)]
    else:
        bn = 32 if n % 32 == 0 else 16
        out += [TileConfig(64, bn, bk, 8, 4, 3)]
    tiles = -(-m // out[0].bm) * (n // out[0].bn)
    if tiles < 2 * sms:
        small = [TileConfig(64, 64, bk, 8, 4, 4)] if n % 64 == 0 else []
        if n % 128 == 0:
            small.insert(0, TileConfig(64, 128, bk, 8, 4, 4))
        out = small + out
    seen: list[TileConfig] = []
    for cfg in out:
        acc_per_thread = cfg.bm * cfg.bn // (32 * cfg.num_warps)
        if has_res and acc_per_thread > 64:
            cfg = TileConfig(cfg.bm, min(cfg.bn, 128), cfg.bk, cfg.group_m, 8, cfg.num_stages)
        if cfg.fits(n, c) and cfg not in seen:
            seen.append(cfg)
    seen = seen[:limit]
    if c == bk and n % 64 == 0:
        # Input channels in one K step (64 or 128). For a 1×1 layer the pipeline's stages hold nothing
        # to overlap and the tile's life is load → one MMA → epilogue, so occupancy hides the latency:
        # single-stage tiles on 4 warps use a third of the shared memory and half the registers. 3×3
        # layers of the same width get them too; the timing decides.
        wide = 128 if n % 128 == 0 else 64
        for cfg in (TileConfig(64, wide, bk, 8, 4, 1), TileConfig(128, 64, bk, 8, 4, 1)):
            if cfg.fits(n, c) and cfg not in seen:
                seen.append(cfg)
    if has_res:  # each candidate also with the residual loaded before the K loop: timed, not assumed
        seen += [dataclasses.replace(cfg, early_res=True) for cfg in seen]
    return seen


def gemm_mode() -> str:
    """``DEEPGAP_QUANT_GEMM``: 'persistent' (unset: the persistent tiles are timed too), 'narrow' or 'off'.

    Why an environment switch: the persistent kernel became the default after one H200 timed it (session 22:
    ResNet-50 at batch 256 +4.7% fp8, +6.7% int8, results/h200/session22); 'off' gives the engine as it was
    before (grouped tiles only), to set the two side by side or to rule the kernel out. 'narrow' offers the
    persistent tiles as before session 48: no 128- or 256-column tile for a residual layer (`WIDE_RESIDUAL`).
    """
    return switches.read(GEMM_ENV)


def small_batch_offered() -> bool:
    """Split-K tiles (`quant.split_k`) are offered where a layer's tiles leave most SMs idle (batch 1).

    ``DEEPGAP_QUANT_SMALL_BATCH``: 'on' (the default since session 27 timed them on an H200: ResNet-50's
    late 3×3 layers 13–42% faster at batch 1) or 'off', to time the engine without them; 'split' offers
    them without the spread ones (`small_batch_mode`). (The switch once
    offered a fused average-pool + classifier head too; it was 2.8–4.1× slower than torch's path in all
    three of its variants, 26.8–39.5 µs against 9.6, and is gone.)
    """
    return small_batch_mode() != "off"


def small_batch_mode() -> str:
    """``DEEPGAP_QUANT_SMALL_BATCH``: 'on' (split-K tiles, spread ones too: `split_k.spread_sum`), 'split', 'off'.

    'split' is the engine before session 41's spread tiles, to set the two side by side on a GPU.
    """
    return switches.read(SMALL_BATCH_ENV)


def persistent_configs(
    node: ConvNode, m: int, capability: tuple[int, int] | None, qfmt: str = "int8", sms: int = SMS_H100
) -> list[TileConfig]:
    """Tiles of the persistent TMA kernel worth timing for a 1×1 stride-1 layer of ``m`` rows, else none.

    The tiles that won in session 22's per-shape timing on one H200 (results/h200/session22,
    ``gemm_1x1-3.jsonl.gz``: ResNet-50's 13 1×1 shapes at batch 256, int8 and fp8, every tile below timed
    against the tuned grouped tile), and for a residual layer `WIDE_RESIDUAL` too (session 48; not with
    ``DEEPGAP_QUANT_GEMM=narrow``):

    - 128×64×BK, 4 warps, two programs per SM: the best persistent tile on 20 of the 26 (shape, precision)
      pairs, and faster than the grouped tile on 14 of them (up to 1.55×); 3 stages at N = 64 (faster than
      4 on all four such pairs, by 2–5%), 4 stages wider (the only 128×64 tile timed there);
    - fp8 without a residual, N a multiple of 128: 128×128×BK, 8 warps, 3 stages, one program per SM, its
      output through TMA: the best persistent tile on the other 6 (6 of those 7 fp8 shapes), faster than
      the grouped tile on 3 (1.39×, 1.15×, 1.004×). In int8 it never was the best persistent tile.

    Timed there and never the best persistent tile, so not offered: 128×128 without the TMA epilogue, the
    residual prefetched a tile ahead (``early_res``), the 128×64 tile with a TMA epilogue. None where there
    are fewer 128×64 tiles than the 2 × ``sms`` programs (no program would walk more than one: nothing to
    gain, and no such shape was timed; every layer at batch 1 on an H200), none below Hopper (TMA needs
    compute capability 9.0; ``capability`` None is the CPU's interpreter, which runs them), none where
    `gemm_mode` is 'off'. BK takes the whole K up to 128.
    """
    mode = gemm_mode()
    if mode == "off" or (capability is not None and capability < (9, 0)):
        return []
    if not node.pointwise:
        return []
    n, c = node.cout, node.cin
    if n % 64 or -(-m // 128) * (n // 64) < 2 * sms:
        return []
    bk = 128 if c % 128 == 0 else 64 if c % 64 == 0 else 32 if c % 32 == 0 else 16
    out = [TileConfig(128, 64, bk, 8, 4, 3 if n == 64 else 4, persistent=2)]
    if qfmt == "fp8" and node.residual is None and n % 128 == 0:
        out.append(TileConfig(128, 128, bk, 8, 8, 3, persistent=1, tma_epilogue=True))
    if node.residual is not None and mode == "persistent":
        out += [dataclasses.replace(t, bk=bk) for t in WIDE_RESIDUAL if n % t.bn == 0]
    return [cfg for cfg in out if cfg.fits(n, c)]


# Wider tiles for a residual 1×1 layer (session 48, issue 47). The 128×64 tile reads each row block of A once per
# 64 output columns: N / 64 = 8-32 times in ResNet-50's `conv3` layers, which at batch 1024 on one H100 ran at
# 1.2-2.0 TB/s of HBM (session 43's per-layer table). Compiled for sm_90 (Triton 3.6) none spills: 128×256 on 8
# warps takes 190-255 registers with its epilogue in two 128-column halves (`persistent.gemm_1x1_kernel`'s
# ``EPI_N``), 128×128 with a TMA epilogue 126-128. (128×256 with a TMA epilogue is left out: with an fp16 output,
# as layer4's last, its stages and halves would take 211 KB, over `SMEM_BUDGET_BYTES`.) Measured (one H100, batch
# 1024, results/h100/session48): kept for layer3's and layer4's `conv3` (layer4.0 197 -> 178 µs fp8), slower at
# layer1/2; ResNet-50 fp8 +0.2%. These layers stay at 1.2-2.1 TB/s whatever the tile: A's re-reads did not bind.
WIDE_RESIDUAL = (
    TileConfig(128, 256, 128, 8, 8, 3, persistent=1, split_epilogue=True),
    TileConfig(128, 128, 128, 8, 8, 4, persistent=1, tma_epilogue=True),
)


SMEM_BYTES_H100 = 227 * 1024  # shared memory one block may take on sm_90


def linear_persistent_configs(k: int, n: int, out_bytes: int = 2) -> list[TileConfig]:
    """Tiles of the persistent fp8 Linear (`linear_kernels.fp8_linear_persistent_kernel`) worth timing.

    For the large-M GEMMs of a transformer at batch 256 (M = 32,768 or 50,432 rows; K, N ≥ 768): the
    grouped kernel's best tile (128×256×128, 8 warps, 3 stages) walked persistently, its epilogue in two
    halves (whole, with GELU, it spills on sm_90: 255 registers; halved, about 200 and none) with and
    without its output through TMA, and whole; 128×128 tiles (no spills either way) with a fourth stage
    or a TMA epilogue; ResNet's winning 128×64, 4 warps, 4 stages at two programs per SM (issue 47); a
    256×128×64 tile, halved. Each is fitted to ``k`` and ``n`` (`TileConfig.fit`; halves narrower than 32 columns
    are not split) and kept only if its stages, its output tile (``out_bytes`` per element; TMA epilogue
    only) and its programs per SM fit an SM's shared memory.
    """
    wide = TileConfig(128, 256, 128, 8, 8, 3, persistent=1, split_epilogue=True)
    square = TileConfig(128, 128, 128, 8, 8, 4, persistent=1)
    cands = [
        wide,
        dataclasses.replace(wide, tma_epilogue=True),
        dataclasses.replace(wide, split_epilogue=False),
        square,
        dataclasses.replace(square, num_stages=3, tma_epilogue=True),
        TileConfig(128, 64, 128, 8, 4, 4, persistent=2),
        TileConfig(256, 128, 64, 8, 8, 3, persistent=1, split_epilogue=True),
    ]
    out: list[TileConfig] = []
    for cfg in (c.fit(k, n) for c in cands):
        if cfg.split_epilogue and cfg.bn < 64:
            cfg = dataclasses.replace(cfg, split_epilogue=False)
        epi = cfg.bm * cfg.bn * out_bytes // (2 if cfg.split_epilogue else 1) if cfg.tma_epilogue else 0
        smem = (cfg.num_stages * (cfg.bm + cfg.bn) * cfg.bk + epi) * cfg.persistent
        if smem <= SMEM_BYTES_H100 and cfg not in out:
            out.append(cfg)
    return out


def assign_formats(graph: Graph, modes: dict[str, str], qfmt: str) -> tuple[Graph, dict[str, str]]:
    """Storage format of every tensor given each convolution's mode ('q' or 'fp16').

    A tensor is stored in the format its convolution readers want (the quantized ``qfmt`` for a 'q'
    layer, fp16 for an fp16 layer or the head); a tensor read only as a residual is stored quantized.
    When readers disagree the tensor is stored for the first and a `ConvertNode` makes the other copy.
    The stem convolution (3 input channels) is always fp16 and its output feeds the max-pool in fp16.

    Returns:
        (graph with any ConvertNodes inserted and readers re-pointed, {tensor: format}).
    """
    fmts = {graph.input: "fp16"}
    nodes: list = []
    repoint: dict[int, str] = {}  # id(original reader node) → new input tensor
    for node in graph.nodes:
        nodes.append(dataclasses.replace(node, inp=repoint[id(node)]) if id(node) in repoint else node)
        wants: list[tuple[str, object]] = []
        for reader, role in graph.consumers(node.out):
            if role != "input":
                continue
            if isinstance(reader, ConvNode):
                wants.append((qfmt if modes.get(reader.name, "q") == "q" else "fp16", reader))
            elif isinstance(reader, (HeadNode, PoolNode)):
                wants.append(("fp16", reader))
        fmt = wants[0][0] if wants else qfmt
        fmts[node.out] = fmt
        for other, reader in wants[1:]:
            if other == fmt:
                continue
            name = f"{node.out}@{other}"
            if name not in fmts:
                nodes.append(ConvertNode(name, node.out, name, other))
                fmts[name] = other
            repoint[id(reader)] = name
    return Graph(nodes, graph.input, graph.output, dict(graph.meta)), fmts


def stem_tile_args(cfg: tuple[int, ...]) -> dict[str, int]:
    """`stem_int8.stem`'s keywords for a Triton stem tile (output pixels a block, warps[, programs an SM[, stages]]).

    A third entry asks for the persistent convolution (`stem_int8.stem_conv_persistent_kernel`) with that
    many programs per SM; without it, one program per tile. A fourth (super pixels only) asks for
    `stem_s2d.stem_swap_kernel`, the weights as the MMA's M side, with that many pipeline stages.
    """
    block, warps, *walk = cfg
    args = {"block_m": block, "num_warps": warps, "persistent": walk[0] if walk else 0}
    return args | ({"swap": walk[1]} if len(walk) > 1 else {})


def stem_tile_name(cfg: tuple[int, ...]) -> str:
    """A Triton stem tile's short name: '128x4w', or '128x4wp3' for the persistent walk at 3 programs an SM.

    '128x4wp2-swap2': the swapped super-pixel kernel (`stem_s2d.stem_swap_kernel`) at 2 stages.
    """
    name = f"{cfg[0]}x{cfg[1]}w" + (f"p{cfg[2]}" if len(cfg) > 2 else "")
    return name + (f"-swap{cfg[3]}" if len(cfg) > 3 else "")


def stem_and_pool(graph: Graph) -> tuple[ConvNode, PoolNode]:
    """The stem convolution and the max-pool that reads it (fused at run time)."""
    conv, pool = graph.nodes[0], graph.nodes[1]
    if not (isinstance(conv, ConvNode) and isinstance(pool, PoolNode) and pool.inp == conv.out):
        raise ValueError("expected the graph to start with the stem convolution followed by its max-pool")
    if len(graph.consumers(conv.out)) != 1:
        raise ValueError("the stem convolution's output must feed only the max-pool")
    return conv, pool


@dataclass
class LayerTiming:
    """What prepare measured for one convolution (seconds per batch; None = not available)."""

    name: str
    macs: int
    q_s: float | None = None
    fp16_s: float | None = None
    config: str | None = None
    q_error: str | None = None  # why the quantized kernel is not usable (compile/self-check failure)
    mode: str = "q"
    kernel: str = "triton"  # 'triton', 'torch' (_int_mm/_scaled_mm) or 'cudnn'
    gemm: tuple[int, int, int] | None = None  # (M, N, K) of the implicit GEMM: rows, C_out, C_in·k²
    bytes: int | None = None  # fewest bytes of the quantized kernel: input, weights, residual, output once
    from_cache: bool = False  # fp16_s and the tile came from the tuning cache (q_s is timed anyway)

    def as_dict(self) -> dict:
        """Plain dict for ``Prepared.info``."""
        return dataclasses.asdict(self)


def choose_modes(timings: list[LayerTiming], margin: float = 0.02) -> dict[str, str]:
    """Keep the faster of quantized and fp16 per layer; quantized wins ties within ``margin``.

    A layer whose quantized kernel failed, or was not timed, runs in fp16 when fp16 was timed.
    Sets ``mode`` on each timing and returns {layer name: mode}.
    """
    modes = {}
    for t in timings:
        if t.q_s is None:
            t.mode = "fp16"
        elif t.fp16_s is None:
            t.mode = "q"
        else:
            t.mode = "q" if t.q_s <= t.fp16_s * (1.0 + margin) else "fp16"
        modes[t.name] = t.mode
    return modes
