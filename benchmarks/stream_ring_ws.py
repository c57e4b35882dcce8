"""`stream_ring.py`'s walk with a producer warp: do the weights keep streaming while the program waits at a barrier?

Why: on one H100 (session 48, results/h100/session48) one program an SM with Triton's software pipeline (eight
16 KB tiles in shared memory) read the 8B step's 7.6 GB at 3.0-3.1 TB/s without barriers (2.50-2.59 ms) but took
2.84-2.93 ms through the step's 161 grid barriers, about 2 µs each. A pipelined loop issues its next load only as
it consumes a tile, so while its warps wait at a barrier no load is issued and HBM may idle once the ring's loads
land.
Here the loads have a warp of their own (Gluon's ``warp_specialize``): it issues TMA copies into a ring of
``STAGES`` tiles whenever a slot is free, barrier or not, and the default partition (4 warps) consumes the
tiles, sums them as `stream_ring.ring_kernel` does and meets the grid barrier at each phase's end. If the
barrier's cost then hides behind the ring, the persistent decode step's floor is the barrier-free rate.

    python benchmarks/stream_ring_ws.py --out OUT       # one JSON line per variant to OUT/stream_ring_ws.jsonl

Tiles are ``BN x BK`` fp8 codes with BK ≤ 256 (a TMA box's widest side). The arena, its phases and the timing
are `stream_ring`'s.

Measured (session 48, one H100): it does not. With barriers 2.96-3.38 ms (with 4 or 8 consumer warps, per-tile or
per-phase sums), without 2.48-2.73 ms: a barrier costs its own time, not idle HBM that a ring could fill.
"""

# ruff: noqa: N803

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from stream_ring import record, setup
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from deepgap.measure.quant.whole_flow import LIMIT, block_barrier_asm

PARTITION_BARRIER = gl.constexpr(block_barrier_asm(15))  # named barrier 15: Gluon's partitions use 0 and 1


@gluon.jit
def load_part(desc, ready, empty, bufs, row0, n_items, BN: gl.constexpr):
    """The producer warp: tile j into slot j % STAGES as soon as the consumer has freed it."""
    S: gl.constexpr = bufs.type.shape[0]  # noqa: N806 - a constexpr, Triton's capitals
    for j in range(n_items):
        s = j % S
        mbarrier.wait(empty.index(s), (j // S & 1) ^ 1)
        mbarrier.expect(ready.index(s), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [row0 + j * BN, 0], ready.index(s), bufs.index(s))


@gluon.jit
def compute_part(
    ready, empty, bufs, x_ptr, out_ptr, bar_ptr, err_ptr, ends_ptr, n_items, n_phases, epoch, G, pid,
    BN: gl.constexpr, BK: gl.constexpr, layout: gl.constexpr, BARRIER: gl.constexpr, WARPS: gl.constexpr,
    REDUCE: gl.constexpr,
):  # fmt: skip
    """The consumer warps: each tile's row sums with the phase's input, a grid barrier at each phase's end.

    ``REDUCE`` 0: each tile summed across its threads at once (shuffles a tile); 1: products added element-wise
    into a [BN, BK] fp32 block, summed across threads once at the phase's end (a lighter consumer).
    """
    S: gl.constexpr = bufs.type.shape[0]  # noqa: N806 - a constexpr, Triton's capitals
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, layout))
    x = gl.load(x_ptr + cols).to(gl.float32)
    acc = gl.zeros([BN], gl.float32, layout=gl.SliceLayout(1, layout))
    block = gl.zeros([BN, BK], gl.float32, layout=layout)
    p = 0
    end = gl.load(ends_ptr)
    for j in range(n_items):
        s = j % S
        mbarrier.wait(ready.index(s), j // S & 1)
        w = bufs.index(s).load(layout)
        fence_async_shared()  # the slot's read ordered before the producer's next TMA write into it
        mbarrier.arrive(empty.index(s), count=1)
        if REDUCE == 0:
            acc += gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)
        else:
            block += w.to(gl.float32) * gl.expand_dims(x, 0)
        if j + 1 == end:
            if REDUCE == 1:
                acc = gl.sum(block, axis=1)
                block = gl.zeros_like(block)
            gl.store(out_ptr + (p * G + pid) * BN + rows, acc)
            if BARRIER:
                grid_sync_ws(bar_ptr, err_ptr, (epoch * n_phases + p + 1) * G, WARPS * 32)
            at = p * G * BN + cols
            x = gl.load(out_ptr + at, mask=at < n_phases * G * BN, other=0.0, cache_modifier=".cg").to(
                gl.float32
            )
            acc = gl.zeros_like(acc)
            p += 1
            end = gl.load(ends_ptr + gl.minimum(p, n_phases - 1))


@gluon.jit
def grid_sync_ws(bar_ptr, err_ptr, target, THREADS: gl.constexpr):
    """`stream_ring.grid_sync` for the default partition: a named barrier over its THREADS, not ``bar.sync 0``.

    Why: ``bar.sync 0`` waits for every thread of the block, the producer warp too, which never reaches it. The
    partition's first thread (tid % THREADS == 0; its warps are one or two whole warpgroups) arrives and polls.
    """
    gl.inline_asm_elementwise(
        PARTITION_BARRIER, "=r,l,r,r,l,r", [bar_ptr, target, LIMIT, err_ptr, THREADS], dtype=gl.int32, is_pure=False,
        pack=1,
    )  # fmt: skip


@gluon.jit
def ring_ws_kernel(
    desc, x_ptr, out_ptr, bar_ptr, err_ptr, ends_ptr, n_items, n_phases, epoch, G,
    BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, BARRIER: gl.constexpr, WARPS: gl.constexpr,
    REDUCE: gl.constexpr,
):  # fmt: skip
    """Program ``pid`` walks its ``n_items`` tiles (rows ``pid × n_items × BN`` on of ``desc``), phase by phase."""
    pid = gl.program_id(0)
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [WARPS, 1], [1, 0])
    bufs = gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    row0 = pid * n_items * BN
    # fmt: off
    gl.warp_specialize([
        (compute_part, (ready, empty, bufs, x_ptr, out_ptr, bar_ptr, err_ptr, ends_ptr, n_items, n_phases, epoch, G,
                        pid, BN, BK, layout, BARRIER, WARPS, REDUCE)),
        (load_part, (desc, ready, empty, bufs, row0, n_items, BN)),
    ], [1], [24])
    # fmt: on


class WsRing:
    """`stream_ring.setup`'s arena with a TMA descriptor over it, launched as `ring_ws_kernel`."""

    def __init__(self, s: dict, stages: int, barrier: bool, warps: int = 4, reduce: int = 0) -> None:
        self.s, self.stages, self.barrier, self.warps, self.reduce = s, stages, barrier, warps, reduce
        programs, items, bn, bk = s["w"].shape
        layout = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float8e4nv)
        self.desc = TensorDescriptor.from_tensor(s["w"].view(programs * items * bn, bk), [bn, bk], layout)

    def __call__(self, epoch: int) -> None:  # noqa: D102 - one step
        s = self.s
        programs, _, bn, bk = s["w"].shape
        ring_ws_kernel[(programs,)](
            self.desc, s["x"], s["out"], s["bar"], s["err"], s["ends"], s["items"], s["phases"], epoch, programs,
            BN=bn, BK=bk, STAGES=self.stages, BARRIER=self.barrier, WARPS=self.warps, REDUCE=self.reduce,
            num_warps=self.warps,
        )  # fmt: skip


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="64x256:4:4:0,64x256:8:4:0,32x256:8:8:1,32x256:16:8:1,64x256:8:8:1,"
                    "32x256:16:4:1", help="BNxBK:stages:warps:reduce, comma-separated (BK ≤ 256)")  # fmt: skip
    args = ap.parse_args()
    path = Path(args.out) / "stream_ring_ws.jsonl"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    s = None  # one arena at a time: 7.6 GB each
    for spec in args.variants.split(","):
        tile, *numbers = spec.split(":")
        stages, warps, reduce = map(int, numbers)
        bn, bk = map(int, tile.split("x"))
        if s is None or s["w"].shape[2:] != (bn, bk):
            s = None
            torch.cuda.empty_cache()
            s = setup(sms, bn, bk)
        for barrier in (True, False):
            row = {"bn": bn, "bk": bk, "stages": stages, "warps": warps, "reduce": reduce,
                   "mode": "ws" if barrier else "ws-none", "phases": s["phases"],
                   "GB": round(s["w"].numel() / 1e9, 3)}  # fmt: skip
            record(path, row, s, WsRing(s, stages, barrier, warps, reduce))


if __name__ == "__main__":
    main()
