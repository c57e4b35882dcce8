"""A block's shortcut convolution on a second stream, beside the block's main path (batch 1's idle SMs).

Why: at batch 1 ResNet-50's kernels each fill few SMs, and one graph runs them one after another. Four of them
(each stage's first block's ``downsample``: 4-6 µs each on one H200, session 41's `benchmarks/split_tiles.py`)
read only the block's input and feed only the block's last convolution, as its residual. Forked onto a second
stream right after its input is made, a downsample runs beside the block's conv1 and conv2; the main path
joins it before the convolution that adds it. The captured graph then has four fork/join branches, and the
critical path loses the four downsamples' time.

`schedule` finds such steps (a plain convolution whose output is read only as a later step's residual) and
the order to run them in; `deaths` says when each tensor may go, never before the join of a side step that
reads it (the caching allocator would hand the memory to the main path while the side stream still reads
it); `run` is `QuantNet.forward`'s loop, with the second stream where the network has one.
`branch_choice.choose` captures the network that way too and keeps the graph only where it gives the serial
graph's logits bit for bit (the same kernels) and is faster.
``DEEPGAP_QUANT_BRANCH``: 'auto' (the default since session 43: timed at batch ≤ `branch_choice.MAX_BATCH`,
kept where faster; on one H100 the graph's 0.2676 ms became 0.2547) or 'off'. On the CPU there is one stream:
the serial loop runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from deepgap.core import switches
from deepgap.measure.quant.fold import ConvNode, Graph, dead_after


@dataclass(frozen=True)
class Schedule:
    """The steps' run order (indices into the steps), those on the side stream, and the joins.

    ``joins``: a step's index → the side steps the main path waits for before it runs.
    """

    order: tuple[int, ...]
    side: frozenset[int] = frozenset()
    joins: dict[int, tuple[int, ...]] = field(default_factory=dict)


def mode() -> str:
    """``DEEPGAP_QUANT_BRANCH``: 'auto' (the default) or 'off' (another value is a usage error)."""
    return switches.read("DEEPGAP_QUANT_BRANCH")


def schedule(graph: Graph, names: list[str], first_out: str, skip: set[str] = frozenset()) -> Schedule:
    """Which of the steps ``names`` run on the side stream, and when.

    ``names``: the stem's step first (it makes ``first_out``), then graph nodes by name. A side step is a
    convolution step, not in ``skip`` (fused pairs, the whole-network kernel's layers), whose output no step
    reads but one later step, as its residual. It moves to right after the step that makes its input, and
    that later step joins it.
    """
    nodes = {n.name: n for n in graph.nodes}
    made = {first_out: 0}  # tensor → the index of the step that makes it
    readers: dict[str, list[tuple[int, str]]] = {}
    for i, name in enumerate(names[1:], start=1):
        node = nodes.get(name)
        if node is None or not hasattr(node, "inp"):
            continue  # the whole-network kernel's step: its layers are in ``skip``
        made[node.out] = i
        readers.setdefault(node.inp, []).append((i, "inp"))
        if getattr(node, "residual", None):
            readers.setdefault(node.residual, []).append((i, "residual"))
    side, joins, after = set(), {}, {}
    for i, name in enumerate(names[1:], start=1):
        node = nodes.get(name)
        if not isinstance(node, ConvNode) or name in skip or node.inp not in made:
            continue
        reads = readers.get(node.out, [])
        if len(reads) != 1 or reads[0][1] != "residual" or reads[0][0] <= i or names[reads[0][0]] in skip:
            continue
        side.add(i)
        joins.setdefault(reads[0][0], []).append(i)
        after.setdefault(made[node.inp], []).append(i)
    order: list[int] = []
    for i in range(len(names)):
        if i not in side:
            order += [i, *after.get(i, [])]
    return Schedule(tuple(order), frozenset(side), {k: tuple(v) for k, v in joins.items()})


def deaths(graph: Graph, names: list[str], sched: Schedule) -> list[list[str]]:
    """Per position in ``sched.order``: the tensors to drop after that step (`fold.dead_after`'s rule).

    A tensor a side step reads is kept until the main path has joined that step.
    """
    dead = dead_after(graph, [names[i] for i in sched.order])
    at = {i: p for p, i in enumerate(sched.order)}
    nodes = {n.name: n for n in graph.nodes}
    for s in sched.side:
        inp = nodes[names[s]].inp
        join = min(at[j] for j, sides in sched.joins.items() if s in sides)
        for p in range(at[s], join):
            if inp in dead[p]:
                dead[p].remove(inp)
                dead[join].append(inp)
    return dead


def run(net: Any, steps: list, env: dict, side: torch.cuda.Stream | None) -> None:
    """``net``'s steps (`QuantNet.forward`): in order, or with the side steps on ``side`` (`schedule`).

    A side step forks after its input is made and is joined before its reader; each tensor goes after its last
    reader (`deaths`).
    """
    names = [n for n, _ in steps]
    sched = (
        schedule(net.graph, names, net.stem.out, skip_of(net))
        if side is not None
        else Schedule(tuple(range(len(steps))))
    )
    main = torch.cuda.current_stream(side.device) if side is not None else None
    for i, drop in zip(sched.order, deaths(net.graph, names, sched), strict=True):
        if i in sched.joins:
            main.wait_stream(side)
        if i in sched.side:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                steps[i][1](env)
        else:
            steps[i][1](env)
        for t in drop:
            env.pop(t, None)


def skip_of(net: Any) -> set[str]:
    """Steps that may not move: fused pairs (both convolutions) and the whole-network kernel's layers."""
    skip = set(net.pairs) | {second for second, _ in net.pairs.values()}
    return skip | (set(net.whole.names) if net.whole is not None else set())
