"""Where a replayed step's time goes when its kernels overlap: each kernel's share of the critical path.

Why not the profiler's per-kernel totals: with programmatic dependent launch (PDL) a kernel starts while its
predecessor runs and waits inside (``griddepcontrol.wait``), so its duration counts time the predecessor
owns, and the durations add up to more than the step. What a kernel costs the step is how far it moves the
step's end: its end past every earlier kernel's (``adds``), plus any time the GPU ran nothing before it
started (``idle``). Summed over a window, adds and idle give the window's span exactly.

Kernels are labelled by name and by their place in the step: a name that runs ``layers × m`` times a step is
``name[i]`` for its i-th use within a layer (a fused GEMV's qkv, o, gate_up and down are ``[0]`` to ``[3]``);
one that runs a few times a step is ``name#i``. Input: `deepgap.roofline.trace.gpu_kernels` of a profiler
trace over ``steps`` replays of one CUDA graph (`benchmarks/llm_decode_loop.py --timeline`).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from deepgap.roofline.cluster import short_name
from deepgap.roofline.trace import KernelEvent


@dataclass(frozen=True)
class Share:
    """One label's part of a step, in µs a step (its uses summed), and the medians of one use."""

    label: str
    per_step: int  # uses a step
    adds_us: float  # the step's end moved, a step (Σ over its uses, mean over steps)
    idle_us: float  # the GPU idle just before its uses, a step
    dur_us: float  # median duration of one use (overlap included)
    lead_us: float  # median start of one use after the previous kernel's end (< 0: overlapped)

    @property
    def cost_us(self) -> float:
        """What the label costs a step: the end it moves plus the idle time before it."""
        return self.adds_us + self.idle_us


@dataclass(frozen=True)
class Timeline:
    """A window of ``steps`` replays: the span a step and every label's share (largest first)."""

    steps: int
    step_us: float
    shares: tuple[Share, ...]


def labels(names: list[str], steps: int, layers: int) -> list[str]:
    """Each kernel's label, in order (module docstring); a name whose uses are not a multiple of steps is kept."""
    count = Counter(names)
    seen: Counter[str] = Counter()
    out = []
    for name in names:
        short, uses = short_name(name), count[name]
        j = seen[name]
        seen[name] += 1
        if uses % steps:
            out.append(short)
            continue
        per_step = uses // steps
        if per_step % layers == 0 and per_step > layers:
            out.append(f"{short}[{(j % per_step) % (per_step // layers)}]")
        elif per_step % layers == 0 or per_step == 1:
            out.append(short)
        else:
            out.append(f"{short}#{j % per_step}")
    return out


def critical_path(kernels: list[KernelEvent], steps: int, layers: int) -> Timeline:
    """Each label's ``adds`` and ``idle`` over the window (module docstring), per step."""
    if steps < 1 or layers < 1:
        raise ValueError(f"steps ({steps}) and layers ({layers}) must be at least 1")
    ks = sorted((k for k in kernels if k.kind == "kernel"), key=lambda k: k.ts_us)
    if not ks:
        raise ValueError("no GPU kernels in the trace: was the profiler given CUDA activities?")
    names = labels([k.name for k in ks], steps, layers)
    adds: dict[str, float] = defaultdict(float)
    idle: dict[str, float] = defaultdict(float)
    durs: dict[str, list[float]] = defaultdict(list)
    leads: dict[str, list[float]] = defaultdict(list)
    end = prev_end = ks[0].ts_us
    for i, (k, label) in enumerate(zip(ks, names, strict=True)):
        stop = k.ts_us + k.dur_us
        idle[label] += max(0.0, k.ts_us - end)
        adds[label] += max(0.0, stop - max(end, k.ts_us))
        durs[label].append(k.dur_us)
        if i:  # the first kernel has no predecessor in the window
            leads[label].append(k.ts_us - prev_end)
        end, prev_end = max(end, stop), stop
    shares = [
        Share(
            label,
            round(len(durs[label]) / steps),
            adds[label] / steps,
            idle[label] / steps,
            statistics.median(durs[label]),
            statistics.median(leads[label]) if leads[label] else 0.0,
        )
        for label in durs
    ]
    shares.sort(key=lambda s: -s.cost_us)
    return Timeline(steps, (end - ks[0].ts_us) / steps, tuple(shares))


def table(t: Timeline) -> str:
    """The shares as text: µs a step, % of the step, and one use's median duration and lead."""
    head = (
        f"{'kernel':<34} {'uses':>5} {'µs/step':>8} {'%':>6} {'adds':>8} {'idle':>7} {'dur':>7} {'lead':>7}"
    )
    lines = [f"step {t.step_us:.1f} µs (mean of {t.steps}), critical path by kernel:", head]
    for s in t.shares:
        lines.append(
            f"{s.label[:34]:<34} {s.per_step:>5} {s.cost_us:>8.1f} {100 * s.cost_us / t.step_us:>6.1f} "
            f"{s.adds_us:>8.1f} {s.idle_us:>7.1f} {s.dur_us:>7.2f} {s.lead_us:>7.2f}"
        )
    return "\n".join(lines)
