"""Where the whole-step decode kernel's time goes (`deepgap.measure.llm_whole`), phase by phase, per mode.

Why: the kernel was written without a GPU (session 35), and a decode loop's tokens/s says nothing of why. Per
``DEEPGAP_DECODE_WHOLE`` mode this builds the decoder as the bare loop does (`llm_decode_loop.build`, random
weights), runs the kernel alone on one hidden row at position ``--pos`` of the cache, times its launch in a CUDA
graph (median of five windows of ``--reps`` replays), and reads program 0's global timer after each barrier
(median over ``--stamps`` launches of each phase's mean over the layers: its work and the barrier's wait). Each
GEMV phase's weight bytes give its TB/s, to set beside a plain read of the same sizes (`hbm_read.py`). A phase
runs from program 0's leaving one wait to its leaving the next, so it holds the wait for the slowest program;
the launch's ms is timed without the timer.

A variant is a mode, or a mode with some of its tiles changed (`llm_whole_plan.variant`: ``l2+lead_kb=128``,
``on+o=8x4096+down=16x2048``; `llm_decode_loop.py --whole` takes the same). Each variant's hidden row is
held to the first variant's (relative L2 error, ``rel_vs_first``): a variant whose rows differ is wrong, not
fast. Session 36 (no GPU) added the L2 lead and wider steps: one program an SM holds only 8-32 KB of weights
in flight, and the variants say which way more bytes in flight pays.

    python benchmarks/whole_decode_phases.py --model llama-3.1-8b --precision fp8 --modes on,l2,ahead --out OUT

One JSON line per variant (to ``--out``/whole_decode_phases.jsonl) and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

PHASES = ("qkv", "attend", "o", "gate_up", "down")
# session 36's sweep: the modes; the L2 lead at half and twice `LEAD_KB`; every phase's step 32 KB (o's bands
# 8 × 4096 and down's 16 × 2048, against 16 and 8 KB; qkv's and gate_up's pairs are 32 KB already, and wider ones
# spill at 16 warps) without and with the lead, and down's at 16 KB; ``ahead`` with the lead
VARIANTS = (
    "on,l2,ahead,l2+lead_kb=32,l2+lead_kb=128,on+o=8x4096+down=16x2048,l2+o=8x4096+down=16x2048,"
    "l2+o=8x4096+down=8x2048,ahead+lead_kb=64"
)


def _args(m, pos: int):
    """The kernel's operands for one row at ``pos``: as `WholeStep.__call__` passes them."""
    step = m.whole_step
    d = m.shape.head_dim
    x = torch.randn(1, m.shape.hidden, device="cuda").bfloat16()
    cos, sin = m.angles(torch.tensor([pos], device="cuda"), torch.bfloat16)
    at = torch.tensor([pos], dtype=torch.int64, device="cuda")
    return (x, cos.reshape(d), sin.reshape(d), at, step.operands, m.cache.k, m.cache.v, step.heads, step.eps)


def _launch_ms(run, reps: int) -> float:
    """Median ms of one launch: five windows of ``reps`` replays of a CUDA graph of it."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    windows = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            graph.replay()
        b.record()
        b.synchronize()
        windows.append(a.elapsed_time(b) / reps)
    return statistics.median(windows)


def _phases_us(run, layers: int, stamps: int) -> list[float]:
    """Each phase's µs (median over launches of the mean over layers), from program 0's timer."""
    from whole_phases import timer_deltas_us

    n = len(PHASES)
    per = [
        [statistics.fmean(d[i::n]) for i in range(n)]
        for d in timer_deltas_us(run, 1 + n * layers, stamps, "cuda")
    ]
    return [statistics.median(col) for col in zip(*per, strict=True)]


class Flagged(Exception):  # noqa: N818 - what happened, not an error name
    """A variant's first launch set the error flag (a wait gave up): not timed, since each launch would spin."""


def measure(m, variant: str, asked, pos: int, reps: int, stamps: int, first: torch.Tensor | None):
    """(row, hidden row): the launch's ms and weight TB/s, each phase's µs and TB/s, and the variant's output.

    ``asked``: the variant's (mode, tiles) (`llm_whole_plan.variant`); ``first``: the first variant's output,
    which this one's is held to (None: this is the first).
    """
    from deepgap.measure import llm_fused, llm_whole_plan

    mode, tiles = asked
    os.environ["DEEPGAP_DECODE_WHOLE"] = mode
    llm_fused.configure(m)
    step = m.whole_step = llm_whole_plan.WholeStep(m, tiles)
    llm_whole_plan.reset_counters()  # a flagged variant before this one leaves its flag
    torch.manual_seed(0)
    args = _args(m, pos)

    def run(times=None):
        return llm_whole_plan.run(*args, step.tiles, times=times)

    with torch.inference_mode():
        h = run().float()  # compile, the residency check, the table
        torch.cuda.synchronize()
        # a wait gave up: each further launch would spin to the limit at every wait
        if llm_whole_plan.flagged(m.cache.k):
            raise Flagged(variant)
        ms = _launch_ms(run, reps)
        phases = _phases_us(run, m.shape.layers, stamps)
    flagged = llm_whole_plan.flagged(m.cache.k)
    per = len(step.operands) // m.shape.layers
    layer = step.operands[:per]
    nbytes = {
        name: layer[2 * i].nbytes + layer[2 * i + 1].nbytes
        for i, name in enumerate(("qkv", "o", "gate_up", "down"))
    }
    total = sum(t.nbytes for t in step.operands)
    row = {
        "mode": variant,
        "tiles": str(step.tiles),
        "pos": pos,
        "launch_ms": round(ms, 4),
        "flagged": flagged,
    }
    ref = h if first is None else first
    row["rel_vs_first"] = float((h - ref).norm() / ref.norm().clamp_min(1e-30))
    row["weights_tb_s"] = round(total / ms / 1e9, 3)
    for name, us in zip(PHASES, phases, strict=True):
        row[f"{name}_us"] = round(us, 2)
        if name in nbytes:
            row[f"{name}_tb_s"] = round(nbytes[name] / us / 1e6, 3)
    return row, h


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--precision", default="fp8")
    p.add_argument("--modes", default=VARIANTS, help="variants: MODE[+FIELD=VALUE...], comma-separated")
    p.add_argument("--pos", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--stamps", type=int, default=10)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    variants = a.modes.split(",")
    from deepgap.measure import llm_whole_plan

    asked = {v: llm_whole_plan.variant(v) for v in variants}  # a bad variant stops before the model is built
    from llm_decode_loop import build

    m = build(a.model, a.precision)
    m.setup_cache(1, a.pos + 128)
    print(
        f"{'variant':44} {'ms':>7} {'TB/s':>6} " + " ".join(f"{n + ' µs':>11}" for n in PHASES) + "  rel",
        flush=True,
    )
    first = None
    for variant in variants:  # each row written as it is measured: a timeout keeps the ones before it
        try:
            r, h = measure(m, variant, asked[variant], a.pos, a.reps, a.stamps, first)
        except Flagged:
            print(f"{variant:44} FLAGGED: the first launch's grid barrier gave up; not timed", flush=True)
            continue
        first = h if first is None else first
        with (Path(a.out) / "whole_decode_phases.jsonl").open("a") as f:
            f.write(json.dumps(r) + "\n")
        cells = " ".join(f"{r[n + '_us']:>11.2f}" for n in PHASES)
        flag = "  FLAGGED" * r["flagged"]
        line = f"{r['mode']:44} {r['launch_ms']:>7.3f} {r['weights_tb_s']:>6.2f} {cells}  {r['rel_vs_first']:.1e}"
        print(line + flag, flush=True)


if __name__ == "__main__":
    main()
