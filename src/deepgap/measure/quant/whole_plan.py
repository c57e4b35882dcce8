"""The table, arenas and launch of `whole.whole_kernel`: a quantized network's convolutions as one kernel.

Why a plan: the kernel reads each layer's shapes and offsets from a device table, so everything it touches
lives in arenas made once per (network, batch): the 8-bit weights back to back, α and β, every
activation the convolutions write (each its own region: no region is reused within a launch, so a
program's L1 never holds an earlier layer's bytes at an address), the split-K partials and tickets, and
the barrier counters. The network's input (the stem's output) is read where it lies, as an offset from the
activation arena passed at launch. The plan owns its arenas, so a CUDA graph that replays the launch
reads live memory as long as the network (which holds the plan) lives.

What it takes (`eligible`): every convolution quantized, in the network's one 8-bit format in and out (no
conversion node), channels in multiples of 64, each reading the stem's output or an earlier layer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from deepgap.measure.quant import layers, split_k, whole
from deepgap.measure.quant.fold import ConvNode
from deepgap.measure.quant.launch import check

if TYPE_CHECKING:
    from deepgap.measure.quant.network import QuantNet

ALIGN = 128  # bytes: every arena region starts on a 128-byte boundary (16-byte vector loads, whole lines)
MAX_SPLIT = split_k.MAX_SPLIT  # K slices of one tile at most


@dataclass(eq=False)
class Plan:
    """A network's convolutions laid out for `whole.whole_kernel` at one batch; ``run`` launches it."""

    names: list[str]
    input: str  # the tensor the first layers read (the stem's output)
    output: str  # the last convolution's output, which the head reads
    qfmt: str
    batch: int
    programs: int  # the launch's grid: at most one program per SM (the barriers need all resident)
    max_split: int
    barrier: int  # the grid barrier's form (`whole_flow.grid_sync`)
    warps: int  # warps a program
    stages: int  # the K loops' software-pipeline stages
    table: torch.Tensor  # int64 [layers + 1, whole.NF]: the last row zeros
    gamma: torch.Tensor  # fp32 [layers + 1]
    act: torch.Tensor  # the activation arena, in the network's 8-bit dtype
    weights: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    out16: torch.Tensor  # the last layer's output when the head reads it in fp16 (else unused)
    fp16_out: bool  # whether it does (the whole network, whose head reads fp16)
    ws: torch.Tensor  # split-K partials (int32 for int8, fp32 for fp8)
    cnt: torch.Tensor  # split-K tickets, zero between launches
    sync: torch.Tensor  # barrier counters, exit counter, error flag
    flow: bool  # tiles wait for the row blocks they read instead of barriers (`whole_flow`)
    counters: torch.Tensor  # the row blocks' done counts (int32), zero between launches
    n_phases: int
    in_shape: tuple[int, int]
    regions: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # tensor → (offset, rows, cols)

    @property
    def label(self) -> str:
        """What the plan runs, for engine_info and the per-layer table."""
        splits = sum(int(v) > 1 for v in self.table[:, whole.COL["split"]].tolist())
        return (
            f"{len(self.names)} convolutions (to {self.names[-1]}) in {self.n_phases + 1} phases, "
            f"{self.programs} programs, "
            f"split-K ≤ {self.max_split} ({splits} split), barrier {self.barrier}, {self.warps} warps, "
            f"{self.stages} stages{', dataflow' if self.flow else ''}"
        )

    def view(self, name: str) -> torch.Tensor:
        """Tensor ``name``'s region of the activation arena as its [rows, cols] matrix (the head's fp16 its own)."""
        if name == self.output and self.fp16_out:
            return self.out16
        off, rows, cols = self.regions[name]
        return self.act[off : off + rows * cols].view(rows, cols)

    def run(
        self,
        x: torch.Tensor,
        programs: int | None = None,
        times: torch.Tensor | None = None,
        skip_work: bool = False,
    ) -> torch.Tensor:
        """Every convolution on the stem's output ``x``; returns the last one's output (a view of the arena).

        ``programs``: the launch's grid if not the plan's (the interpreter runs the programs one after
        another, so its tests launch one, which walks every item, split slices included). ``times`` (int64,
        phases + 1 entries; on a GPU) and ``skip_work``: the benchmark's (`whole.whole_kernel`'s ``TIMES`` and
        ``SKIP_WORK``).
        """
        check(
            x.dtype == self.act.dtype and tuple(x.shape) == self.in_shape and x.is_contiguous(),
            f"the whole-network kernel takes a contiguous {self.act.dtype} {list(self.in_shape)}; "
            f"got {x.dtype} {list(x.shape)}",
        )
        check(x.device == self.act.device, f"input on {x.device}, plan on {self.act.device}")
        delta = x.data_ptr() - self.act.data_ptr()  # one byte an element
        check(delta % 16 == 0, "the input must start on a 16-byte boundary")
        whole.launch(x.device, programs or self.programs)(
            self.table, self.gamma, self.act, delta, self.out16, self.weights, self.alpha, self.beta, self.ws,
            self.cnt, self.sync, len(self.names), self.n_phases, self.sync if times is None else times,
            self.counters, self.counters.numel(), NF=whole.NF, ACC_INT=self.qfmt == "int8",
            OUT_KIND=0 if self.qfmt == "int8" else 1, BM=whole.BM, BN=whole.BN, BK=whole.BK, BARRIER=self.barrier,
            TIMES=times is not None, SKIP_WORK=skip_work, FLOW=self.flow,
            FENCE=x.device.type == "cuda", num_warps=self.warps,
            num_stages=self.stages, enable_fp_fusion=False,
        )  # fmt: skip
        return self.view(self.output)

    def flagged(self) -> bool:
        """Whether a barrier gave up waiting since the plan was made (its programs were not all resident)."""
        return bool(self.sync[self.n_phases + 1].item())


def eligible(net: QuantNet, upto: str | None = None) -> str | None:
    """None when `build` can lay out ``net``'s convolutions (up to ``upto``), else why not (one line).

    ``upto``: the last convolution the kernel runs (a stage's last, say); the layers after it then run their
    own kernels and may read only its output.
    """
    if net.qfmt not in ("int8", "fp8"):
        return f"precision {net.qfmt}"
    if net.converts:
        return f"{len(net.converts)} format conversions between layers"
    nodes = _convs(net, upto)
    if not nodes:
        return "no convolution after the stem" if upto is None else f"no convolution {upto!r}"
    written = {net.stem.out}
    for node in nodes:
        layer = net.convs[node.name]
        if layer.mode != "q":
            return f"{node.name} runs in fp16"
        out = {layer.out_fmt} if not (node is nodes[-1] and layer.out_fmt == "fp16") else set()  # the head's
        fmts = {layer.in_fmt} | out | ({layer.res_fmt} if layer.res_fmt else set())
        if fmts != {net.qfmt}:
            return f"{node.name} mixes formats {sorted(fmts)}"
        if node.cin % whole.BK or node.cout % whole.BN:
            return f"{node.name} has {node.cin} → {node.cout} channels (multiples of 64 needed)"
        if node.inp not in written or (node.residual and node.residual not in written):
            return f"{node.name} reads a tensor no earlier layer writes"
        if node.name in net.pairs or node.name in {second for second, _ in net.pairs.values()}:
            return f"{node.name} runs in a fused pair"
        written.add(node.out)
    return _after(net, nodes, written)


def _after(net: QuantNet, nodes: list[ConvNode], written: set[str]) -> str | None:
    """Why the layers after the kernel's cannot read what it leaves (None: they can): only its last output."""
    rest = [n for n in _convs(net) if n.name not in {m.name for m in nodes}]
    if not rest:
        return None if net.head.inp == nodes[-1].out else "the head does not read the last convolution"
    if net.convs[nodes[-1].name].out_fmt == "fp16":
        return f"{nodes[-1].name} is stored in fp16"
    for node in rest:
        reads = {node.inp} | ({node.residual} if node.residual else set())
        if (reads & written) - {nodes[-1].out, net.stem.out}:  # the stem's output lives outside the kernel
            return f"{node.name} reads a tensor inside the kernel other than its last output"
    return None


def build(
    net: QuantNet,
    batch: int,
    programs: int,
    max_split: int = MAX_SPLIT,
    barrier: int = 0,
    splits: dict[str, int] | None = None,
    warps: int = 4,
    stages: int = 3,
    flow: bool = False,
    upto: str | None = None,
) -> Plan:
    """The plan of ``net``'s convolutions at ``batch`` on ``programs`` programs (see `eligible`).

    ``max_split``: split-K slices a tile at most (`_split` picks each layer's); ``splits`` names a layer's
    split instead (1 or a divisor of its K steps). ``barrier``: the grid barrier's form (`whole_flow.grid_sync`);
    ``warps``: warps a program (4 or 8); ``stages``: the K loops' pipeline stages; ``flow``: dataflow counters
    instead of barriers (`whole_flow`). ``programs`` may exceed the SMs only where that many fit at once.
    ``upto``: the last convolution the kernel runs (`eligible`); the layers after run their own kernels.
    """
    why = eligible(net, upto)
    check(why is None, f"the whole-network kernel cannot run this network: {why}")
    check(programs >= 1 and 1 <= max_split <= MAX_SPLIT, f"programs {programs}, max_split {max_split}")
    nodes = _convs(net, upto)
    dev = net.convs[nodes[0].name].w_q.device
    h0, w0, c0 = net.shapes[net.stem.out]
    regions: dict[str, tuple[int, int, int]] = {}
    act_size = w_size = ab_size = ws_size = cnt_size = flow_size = 0
    blocks: dict[str, tuple[int, int]] = {}  # tensor → (its first row-block counter, its column tiles)
    rows, phase_writes = [], set()
    for node in nodes:
        layer = net.convs[node.name]
        h, w, c = net.shapes[node.inp]
        oh, ow, n = net.shapes[node.out]
        m, k_total = batch * oh * ow, node.kernel_size**2 * c
        regions[node.out] = (act_size, m, n)
        tiles = -(-m // whole.BM) * (n // whole.BN)
        split = _split_of(node.name, tiles, k_total // whole.step_k(c), programs, max_split, splits)
        reads = {node.inp} | ({node.residual} if node.residual else set())
        if rows and reads & phase_writes:  # reads what this phase writes: a barrier first
            rows[-1]["sync_after"], phase_writes = 1, set()
        phase_writes.add(node.out)
        rows.append({
            "x_off": regions.get(node.inp, (0,))[0], "w_off": w_size, "out_off": act_size,
            "res_off": regions.get(node.residual, (0,))[0] if node.residual else 0, "ab_off": ab_size, "m": m,
            "n": n, "c": c, "h": h, "w": w, "oh": oh, "ow": ow, "ks": node.kernel_size, "stride": node.stride,
            "pad": node.padding, "relu": int(node.relu), "has_res": int(node.residual is not None),
            "split": split, "sync_after": 0, "ws_off": ws_size, "cnt_off": cnt_size,
            "k_total": k_total, "out16": int(layer.out_fmt == "fp16"),
            # -1: no layer of the plan wrote it, so the network's input (the stem's output)
            "x_cnt": blocks.get(node.inp, (-1, 0))[0], "x_tn": blocks.get(node.inp, (-1, 0))[1],
            "res_cnt": blocks.get(node.residual, (-1, 0))[0], "res_tn": blocks.get(node.residual, (-1, 0))[1],
            "out_cnt": flow_size,
        })  # fmt: skip
        blocks[node.out] = (flow_size, n // whole.BN)
        flow_size += -(-m // whole.BM)
        act_size += _aligned(m * n)
        w_size += _aligned(layer.w_q.numel())
        ab_size += n
        if split > 1:
            ws_size += split * m * n
            cnt_size += tiles
    dtype = layers.DTYPES[net.qfmt]
    acc_dtype = torch.int32 if net.qfmt == "int8" else torch.float32
    weights, alpha, beta, table, gamma = _arenas(net, nodes, rows, w_size, ab_size, dtype, dev)
    n_phases = sum(r["sync_after"] for r in rows)
    last = rows[-1]
    out16 = torch.zeros((last["m"], last["n"]) if last["out16"] else (1,), dtype=torch.float16, device=dev)
    return Plan(
        names=[n.name for n in nodes], input=net.stem.out, output=nodes[-1].out, qfmt=net.qfmt, batch=batch,
        programs=programs, max_split=max_split, barrier=barrier, warps=warps, stages=stages,
        table=table.contiguous(), gamma=gamma, act=torch.zeros(max(act_size, 1), dtype=dtype, device=dev),
        weights=weights, alpha=alpha, beta=beta, out16=out16, fp16_out=bool(last["out16"]),
        ws=torch.zeros(max(ws_size, 1), dtype=acc_dtype, device=dev),
        cnt=torch.zeros(max(cnt_size, 1), dtype=torch.int32, device=dev),
        sync=torch.zeros(n_phases + 2, dtype=torch.int32, device=dev), n_phases=n_phases, flow=flow,
        counters=torch.zeros(max(flow_size, 1), dtype=torch.int32, device=dev),
        in_shape=(batch * h0 * w0, c0), regions=regions,
    )  # fmt: skip


def _arenas(net: QuantNet, nodes: list[ConvNode], rows: list[dict], w_size: int, ab_size: int, dtype, dev):
    """The weight, α and β arenas filled from the layers, the device table and γ (each ending in a zero row)."""
    weights = torch.zeros(max(w_size, 1), dtype=dtype, device=dev)
    alpha = torch.empty(max(ab_size, 1), dtype=torch.float32, device=dev)
    beta = torch.empty_like(alpha)
    for node, row in zip(nodes, rows, strict=True):
        layer = net.convs[node.name]
        weights[row["w_off"] : row["w_off"] + layer.w_q.numel()] = layer.w_q.reshape(-1)
        alpha[row["ab_off"] : row["ab_off"] + row["n"]] = layer.alpha
        beta[row["ab_off"] : row["ab_off"] + row["n"]] = layer.beta
    # a row of zeros past the last layer: the kernel reads each next row before its barrier
    table = torch.tensor(
        [[r[f] for f in whole.FIELDS] for r in rows] + [[0] * whole.NF], dtype=torch.int64, device=dev
    )
    gamma = torch.tensor(
        [float(net.convs[n.name].gamma) for n in nodes] + [0.0], dtype=torch.float32, device=dev
    )
    return weights, alpha, beta, table, gamma


def _convs(net: QuantNet, upto: str | None = None) -> list[ConvNode]:
    """The network's convolutions after the stem, in the graph's order (up to and including ``upto``)."""
    nodes = [n for n in net.graph.nodes[2:] if isinstance(n, ConvNode)]
    if upto is None:
        return nodes
    names = [n.name for n in nodes]
    return nodes[: names.index(upto) + 1] if upto in names else []


def _split_of(name: str, tiles: int, steps: int, programs: int, max_split: int, splits: dict | None) -> int:
    """Layer ``name``'s split: named in ``splits`` (checked against its K steps), else `_split`'s choice."""
    if splits and name in splits:
        check(steps % splits[name] == 0, f"{name}: split {splits[name]} of {steps} K steps")
        return splits[name]
    return _split(tiles, steps, programs, max_split)


def _split(tiles: int, steps: int, programs: int, max_split: int) -> int:
    """K slices a tile of a layer with ``tiles`` tiles of ``steps`` K steps: the most that fit the programs.

    None (1) where the tiles already fill half the programs; else the largest split ≤ ``max_split`` that
    divides the steps and keeps tiles × split within the programs.
    """
    if 2 * tiles > programs:
        return 1
    fit = [s for s in range(min(max_split, steps), 1, -1) if steps % s == 0 and tiles * s <= programs]
    return fit[0] if fit else 1


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
