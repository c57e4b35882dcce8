"""Can one persistent program an SM stream a decoder step's weights at HBM's rate, through its grid barriers?

Why: issue 51's batch-1 goal (480 tokens/s for an 8B fp8 decoder on an H200, 2.083 ms a step) is held back by
the step's structure, not by its GEMVs' reads: six kernels a layer, each paying its launch, ramp and drain, and
HBM idle during the attention (docs/llm.md). A persistent kernel removes the boundaries, but session 37's
(one 16-warp program an SM, loads into registers a step at a time) read its weights at 0.74-1.06 TB/s: 1-4 MB
in flight over 132 SMs where HBM wants ~5 MB. This asks the question that kernel left open, without the
decoder's arithmetic: with Triton's software pipeline (``tl.range(num_stages=S)``: each load S - 1 tiles
ahead, in shared memory), does one program an SM reach the per-kernel GEMVs' ~0.9x of HBM, and does it keep
that rate across ~160 grid barriers a step when the loop runs on through them (``flat``: the next phase's
weights, which no barrier guards, load while the program waits) rather than draining at each (``nested``)?

The weights are the 8B shape's, laid out as the persistent kernel would: each program's share of every phase
back to back in one arena, read in its walk's order. A step is 32 layers of five phases (qkv 25.2 MB, the
attention, one tile a program standing in for its latency, o 16.8 MB, gate_up 117.4 MB, down 58.7 MB) and the
head (525.3 MB), 7.5 GB in all. Each tile of ``BN x BK`` fp8 codes is converted and multiplied by the phase's
input vector (``BK`` values the previous phase wrote, read past L1 after its barrier) and summed per row, as a
batch-1 GEMV does; each phase ends with its program's sums stored, then (``flat``, ``nested``) a grid barrier
(`deepgap.measure.quant.whole_flow`'s, one counter) or (``none``) nothing: the rate without barriers.

    python benchmarks/stream_ring.py --out OUT          # one JSON line per variant to OUT/stream_ring.jsonl

Each line: the variant, µs a step, TB/s, and the step's tokens/s if the weights' reads were all it cost. The
step as it runs today is `llm_decode_loop.py`'s (2.351 ms on one H200, session 45; 2.956 ms on one H100).

Measured (session 48, one H100, results/h100/session48): ``none`` 2.50-2.59 ms (3.0-3.1 TB/s, 0.90-0.92x of
HBM: the ring fixes session 37's rate), ``flat`` 2.84-2.93 ms (about 2 µs a barrier): about today's whole step
before any of its other work, so this form of persistent step cannot beat the per-kernel one. ``nested`` took
~180 ms (about 1.1 ms a barrier), not investigated.
"""

# ruff: noqa: N803

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

from deepgap.measure.device import CudaEventClock
from deepgap.measure.quant.launch import launcher
from deepgap.measure.quant.whole_flow import LIMIT, block_barrier_asm

# Llama-3.1-8B's batch-1 step, fp8: (phase, MB) a layer; "attention" reads no weights (one tile a program)
LAYER_MB = (("qkv", 25.17), ("attention", 0.0), ("o", 16.78), ("gate_up", 117.44), ("down", 58.72))
LAYERS, HEAD_MB = 32, 525.34
MODES = ("flat", "nested", "none")
BLOCK_BARRIER = tl.constexpr(block_barrier_asm(0))  # ``bar.sync 0, $5``: the whole block ($5 its threads)


@triton.jit
def ring_kernel(
    w_ptr, x_ptr, out_ptr, bar_ptr, err_ptr, ends_ptr, n_items, n_phases, epoch, G,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, MODE: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """Program ``pid`` walks its ``n_items`` tiles (``w_ptr``: [G, n_items, BN, BK] codes), phase by phase.

    ``ends_ptr``: the item count at each phase's end (the same for every program). MODE 0 ``flat``: one
    pipelined loop over every item, the barrier inside it; 1 ``nested``: a pipelined loop per phase, the barrier
    between; 2 ``none``: ``flat`` without barriers. ``out_ptr``: [n_phases, G, BN] fp32 sums, whose first BK
    entries of phase p are phase p + 1's input (phase 0's: ``x_ptr``). ``epoch``: the launches before this one
    (the barrier counter is never reset: phase p of launch e waits for (e × n_phases + p + 1) × G arrivals).
    """
    pid = tl.program_id(0)
    rows = tl.arange(0, BN)
    cols = tl.arange(0, BK)
    tile = rows[:, None] * BK + cols[None, :]
    base = w_ptr + pid.to(tl.int64) * n_items * (BN * BK)
    x = tl.load(x_ptr + cols).to(tl.float32)
    acc = tl.zeros([BN], dtype=tl.float32)
    if MODE == 1:
        start = 0
        for p in range(0, n_phases):
            end = tl.load(ends_ptr + p)
            for j in tl.range(start, end, num_stages=STAGES):
                w = tl.load(base + j * (BN * BK) + tile)  # j × tile < 2**31: a program reads < 2 GB
                acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            x, acc = phase_end(
                acc, out_ptr, bar_ptr, err_ptr, p, epoch, n_phases, G, pid, rows, cols, BN, True, THREADS
            )
            start = end
    else:
        p = 0
        end = tl.load(ends_ptr)
        for j in tl.range(0, n_items, num_stages=STAGES):
            w = tl.load(base + j * (BN * BK) + tile)  # j × tile < 2**31: a program reads < 2 GB
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            if j + 1 == end:
                x, acc = phase_end(acc, out_ptr, bar_ptr, err_ptr, p, epoch, n_phases, G, pid, rows, cols, BN,
                                   MODE == 0, THREADS)  # fmt: skip
                p += 1
                end = tl.load(ends_ptr + tl.minimum(p, n_phases - 1))


@triton.jit
def phase_end(
    acc, out_ptr, bar_ptr, err_ptr, p, epoch, n_phases, G, pid, rows, cols,
    BN: tl.constexpr, BARRIER: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """Store this program's sums for phase ``p``; wait at the grid barrier (``BARRIER``); read the next input."""
    tl.store(out_ptr + (p * G + pid) * BN + rows, acc)
    if BARRIER:
        grid_sync(bar_ptr, err_ptr, (epoch * n_phases + p + 1) * G, THREADS)
    at = p * G * BN + cols
    x = tl.load(out_ptr + at, mask=at < n_phases * G * BN, other=0.0, cache_modifier=".cg")
    return x.to(tl.float32), tl.zeros_like(acc)


@triton.jit
def grid_sync(bar_ptr, err_ptr, target, THREADS: tl.constexpr):
    """A grid barrier in one asm block (`whole_flow.block_barrier_asm`): the block's threads meet, its first
    thread fences, adds and polls, they meet again.

    Why not `whole_flow.grid_sync`: its ``tl.debug_barrier`` (compiled for sm_90 by Triton 3.6) stops the
    software pipeline of any loop it sits in, so no load runs ahead across it; the same ``bar.sync`` inside
    the asm leaves the loop pipelined (cp.async a few tiles ahead). Gives up after `LIMIT` polls and sets the
    error flag, as whole_flow's does.
    """
    tl.inline_asm_elementwise(
        BLOCK_BARRIER,
        "=r,l,r,r,l,r",
        [bar_ptr, target, LIMIT, err_ptr, THREADS],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def phases(tile_bytes: int, programs: int) -> list[tuple[str, int]]:
    """(phase, tiles a program) for the 8B step: each phase's bytes over the programs, at least one tile each."""
    per = [(name, mb) for _ in range(LAYERS) for name, mb in LAYER_MB] + [("head", HEAD_MB)]
    return [(name, max(1, round(mb * 1e6 / (tile_bytes * programs)))) for name, mb in per]


def setup(programs: int, bn: int, bk: int, plan: list[tuple[str, int]] | None = None, device: str = "cuda"):
    """The arena ([programs, items, bn, bk] fp8 codes), phase ends, input, outputs, barrier counter, error flag.

    ``plan``: (phase, tiles a program), the 8B step's (`phases`) unless given.
    """
    plan = plan or phases(bn * bk, programs)
    items = sum(n for _, n in plan)
    ends = torch.tensor([sum(n for _, n in plan[: i + 1]) for i in range(len(plan))], dtype=torch.int32)
    w = torch.empty(programs * items * bn * bk, dtype=torch.float8_e4m3fn, device=device)
    chunk = 1 << 28
    for i in range(0, w.numel(), chunk):  # N(0, 1) codes in pieces: a 7.5 GB arena in fp32 would not fit
        w[i : i + chunk] = torch.randn(min(chunk, w.numel() - i), device=device).to(torch.float8_e4m3fn)
    return {
        "w": w.view(programs, items, bn, bk),
        "ends": ends.to(device),
        "x": torch.randn(bk, device=device).to(torch.bfloat16),
        "out": torch.empty(len(plan), programs, bn, dtype=torch.float32, device=device),
        "bar": torch.zeros(1, dtype=torch.int32, device=device),
        "err": torch.zeros(1, dtype=torch.int32, device=device),
        "items": items,
        "phases": len(plan),
    }


def launch(s: dict, epoch: int, stages: int, mode: str, warps: int) -> None:
    """One step of ``s`` (`setup`) as ``mode`` says; ``epoch``: the launches of this arena so far."""
    launcher(ring_kernel, s["w"].device)[(s["w"].shape[0],)](
        *args(s, epoch), **options(s, stages, mode, warps)
    )


def args(s: dict, epoch: int) -> tuple:  # noqa: D103 - the kernel's runtime arguments for `setup`'s arena
    return (
        s["w"],
        s["x"],
        s["out"],
        s["bar"],
        s["err"],
        s["ends"],
        s["items"],
        s["phases"],
        epoch,
        s["w"].shape[0],
    )


def options(s: dict, stages: int, mode: str, warps: int) -> dict:  # noqa: D103 - its constexprs and warps
    _, _, bn, bk = s["w"].shape
    return {
        "BN": bn,
        "BK": bk,
        "STAGES": stages,
        "MODE": MODES.index(mode),
        "THREADS": warps * 32,
        "num_warps": warps,
    }


def misfit(s: dict, stages: int, mode: str, warps: int, per_sm: int) -> str | None:
    """Why ``per_sm`` programs of this variant cannot all be resident on an SM at once (None: they can).

    A grid barrier waits for every program, so a grid that does not fit at once would wait until the polls
    give up: such a variant is not launched with barriers.
    """
    k = ring_kernel.warmup(*args(s, 0), grid=(s["w"].shape[0],), **options(s, stages, mode, warps))
    k._init_handles()
    props = torch.cuda.get_device_properties(0)
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    need_regs = per_sm * warps * 32 * -(-k.n_regs // 8) * 8
    need_smem = per_sm * (k.metadata.shared + 1024)  # 1 KB a block the driver keeps
    if need_regs > regs or need_smem > smem:
        return f"{per_sm} programs an SM need {need_regs} registers, {need_smem} B of shared memory"
    return None


def time_step(s: dict, step, reps: int = 5) -> float:
    """µs a step: the median of ``reps`` calls of ``step(epoch)`` (`CudaEventClock`), after one untimed and checked.

    ``step`` launches one walk of ``s`` (`setup`); ``epoch``: the walks of this arena so far (its barrier count).
    """
    s["bar"].zero_()
    s["err"].zero_()
    clock = CudaEventClock("cuda")
    times = []
    for epoch in range(reps + 1):
        sec = clock.time_iteration(partial(step, epoch))
        if int(s["err"].item()):
            raise RuntimeError("a grid barrier gave up waiting: the programs did not all run at once")
        if epoch:
            times.append(sec * 1e6)
    return sorted(times)[len(times) // 2]


def record(path: Path, row: dict, s: dict, step, misfit_of=None) -> None:
    """``row`` with the walk's µs, TB/s and tokens/s (`time_step`), or the error that stopped it; printed and
    appended to ``path``. ``misfit_of()``: why the variant cannot run (`misfit`), checked first where given."""
    try:
        why = misfit_of() if misfit_of else None
        if why:
            raise RuntimeError(why)
        us = time_step(s, step)
        row |= {"us": round(us, 1), "TBps": round(s["w"].numel() / us / 1e6, 3), "tok_s": round(1e6 / us, 1)}
    except Exception as exc:  # noqa: BLE001 - a variant that fails to compile or run is a row
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"
    print(json.dumps(row), flush=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-sm", default="1,2", help="programs an SM")
    ap.add_argument("--stages", default="1,4,8")
    ap.add_argument("--tiles", default="16x1024,32x1024,8x4096", help="BNxBK codes a tile")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    path = Path(args.out) / "stream_ring.jsonl"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in map(int, args.per_sm.split(",")):
        for spec in args.tiles.split(","):
            bn, bk = map(int, spec.split("x"))
            s = setup(sms * per_sm, bn, bk)
            nbytes = s["w"].numel()
            for warps in map(int, args.warps.split(",")):
                for stages in map(int, args.stages.split(",")):
                    for mode in args.modes.split(","):
                        row = {"per_sm": per_sm, "bn": bn, "bk": bk, "warps": warps, "stages": stages, "mode": mode,
                               "phases": s["phases"], "GB": round(nbytes / 1e9, 3)}  # fmt: skip
                        fit = None if mode == "none" else partial(misfit, s, stages, mode, warps, per_sm)
                        record(path, row, s, partial(launch, s, stages=stages, mode=mode, warps=warps), fit)
            del s
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
