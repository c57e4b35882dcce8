"""The fused GEMVs' tiles timed in the decode step's own CUDA graph (``DEEPGAP_GEMV_TUNE=step``; opt-in until timed).

Why: the tuner (`gemv.fastest`) ranks a tile by 20 calls of that GEMV alone in a graph, and the step does not run
its GEMVs alone: under PDL each one's first weights load while its predecessor drains, beside the attention, and what
a tile costs there is not what it costs alone. On one H200 (session 61, 8B fp8, batch 1, results/h200/session61)
the tuner's qkv tile ran the step at 2.2308 ms a token and an in-thread `4x1024` at 2.1785; the tuner timed on
weights streamed from HBM picked yet others. The default pins qkv's tile to that measurement
(`gemv_fused.QKV_TILE`); this times every fused GEMV shape's candidates where they run, on the card at hand.

How: once the step's warm-up has tuned each fused GEMV alone (`gemv_fused` records each key's candidates here), the
step is captured again per candidate of one shape (every key of that K × N takes it: layer 0's qkv folds the norm,
the others read it handed over, and one tile serves both), replayed, and the fastest kept; shapes in turn, the
largest first (one pass of coordinate descent). About 0.2 s a candidate at the 8B shape. The kept graphs are then
captured as before (`llm_steps._kept`), so the PDL graph still has the plain graph's logits bit for bit. A decode
row's ``decode.tiles`` ends with what was timed (`label`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from deepgap.core import switches

REPLAYS = 30  # replays a candidate's graph is timed over (their median), as `llm_steps._kept` times its two
CANDIDATES: dict[tuple, tuple] = {}  # a fused GEMV's key → its fitted candidates (`gemv_fused._tuned`)
SEARCHED: set[tuple] = set()  # keys whose tile the step has timed: one search a key and process
NOTES: list[str] = []  # per shape: what the search kept against the tuner's tile (`label`)


def on() -> bool:
    """Whether the fused GEMVs' tiles are timed in the step (``DEEPGAP_GEMV_TUNE=step``)."""
    return switches.read("DEEPGAP_GEMV_TUNE") == "step"


def record(key: tuple, cands) -> None:
    """``key``'s candidates, for the step's search (`gemv_fused._tuned` calls it for every fused GEMV it runs).

    ``cands`` is read only the first time a key is seen: `_tuned` runs on every call of an eager step.
    """
    if key not in CANDIDATES:
        CANDIDATES[key] = tuple(dict.fromkeys(cands))


def shapes(table: dict[tuple, tuple]) -> list[tuple[tuple[int, int], list[tuple], list]]:
    """``[((K, N), keys, candidates)]``: the keys of one shape together with the candidates all of them take.

    Largest shape first: its choice moves the step most. A key is ``("fused", variant, K, N, device)``.
    """
    groups: dict[tuple[int, int], list[tuple]] = {}
    for key in table:
        groups.setdefault((key[2], key[3]), []).append(key)
    out = []
    for shape, keys in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
        common = [t for t in table[keys[0]] if all(t in table[k] for k in keys[1:])]
        out.append((shape, keys, common))
    return out


def search(timer: Callable[[], float], tuned: dict) -> None:
    """Each fused shape's candidates timed in the step (``timer()``: ms a step with the tiles now in ``tuned``).

    ``tuned``: the tuner's table (`gemv_fused.tiles_in_step` passes gemv's): its entries for a shape are set to each
    candidate in turn and left at the fastest. A candidate that fails to build or capture is passed over; a shape
    searched before (this process) is not timed again.
    """
    for (k, n), keys, cands in shapes({key: c for key, c in CANDIDATES.items() if key not in SEARCHED}):
        was = {key: tuned.get(key) for key in keys}  # the tuner's, kept where nothing could be timed
        first = was[keys[0]]
        times: dict = {}
        for t in cands:
            for key in keys:
                tuned[key] = t
            try:
                times[t] = timer()
            except Exception:  # noqa: BLE001 - a candidate this step cannot build or capture is passed over
                continue
        best = min(times, key=times.get) if times else None
        for key in keys:
            tuned[key] = best or was[key]
        SEARCHED.update(keys)
        if times:
            tuner = f", the tuner's {times[first]:.4f}" if first in times and first != best else ""
            NOTES.append(f"{k}x{n} {times[best]:.4f} ms of {len(times)} timed{tuner}")


def graph_ms(run: Callable[[], object], device: torch.device, pdl: bool) -> float:
    """Median ms of the step ``run()`` captured in a CUDA graph (under PDL where ``pdl``), over `REPLAYS` replays.

    ``run`` is one decode step on the step's fixed input and position: each replay writes the same K and V at the
    same position, so the cache is left as it was.
    """
    from deepgap.measure.quant import launch
    from deepgap.measure.quant.tuning import time_s

    mode = launch.pdl if pdl else contextlib.nullcontext
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), mode():
        run()  # builds this tile's kernels outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with mode(), torch.cuda.graph(g):
        run()
    try:
        return time_s(g.replay, reps=REPLAYS, device=str(device), use_graph=False) * 1e3
    finally:
        del g


def label() -> str:
    """What a decode row's ``decode.tiles`` adds where the step timed its tiles (`gemv.chosen`)."""
    if not on():
        return ""
    timed = "; ".join(NOTES) or "nothing to time"
    return f" (the fused GEMVs' tiles timed in the step, DEEPGAP_GEMV_TUNE=step: {timed})"
