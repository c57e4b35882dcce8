"""Whether the quant network runs its convolutions as one persistent kernel (`whole`): checked, timed, kept if faster.

Why timed per network: the kernel trades 51 kernel boundaries for 51 grid barriers and one fixed 64×64 tile,
which pays where every layer is short (batch 1: 2–10 µs a layer) and cannot pay where a layer has work
for many waves (batch 256, where each layer's tuned tile wins). So at a batch up to `MAX_BATCH` each plan of
`plans` (split-K caps) is run once on the stem's output of a random batch, each layer's output held to the
exact reference of that layer on the plan's own input (the tuner's rule, `tuning._agree`), and the whole
network is timed both ways (a CUDA graph of the forward, stem and head included); the fastest plan is kept
where it beats the per-layer network by `MARGIN`. engine_info's ``whole`` says what was timed and why.

Off by default (``DEEPGAP_QUANT_WHOLE=on`` offers it, `core.switches`): on one H200 (session 34) every plan was
slower than the per-layer kernels at batch 1, and trying costs each small-batch build a compile and a few timings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from deepgap.core import switches
from deepgap.measure.quant import layers, whole, whole_plan
from deepgap.measure.quant.network import QuantNet

ENV = "DEEPGAP_QUANT_WHOLE"
MAX_BATCH = 8  # offered up to this batch: beyond it the layers' own tiles have waves of work
MARGIN = 0.02  # kept when the network takes at most 98% of its per-layer time
SPLIT_CAPS = (16, 4, 1)  # the plans timed: split-K up to 16, 4 slices a tile, or none
# the kernel's form (`whole_plan.build`): the one-thread barrier, 8 warps (4 spill with K steps of 128), 3 stages
BARRIER, WARPS, STAGES = 1, 8, 3


def offered() -> bool:
    """``DEEPGAP_QUANT_WHOLE``: 'off' (the default) or 'on'; a bad value is a `UsageError`."""
    return switches.read(ENV) == "on"


def plans(net: QuantNet, batch: int, programs: int) -> Iterator[whole_plan.Plan]:
    """The plans timed: the whole network, and each stage's prefix (layer1, layer1–2, …), barriers or dataflow.

    The whole network in every split-K cap of `SPLIT_CAPS` (fewer where two give the same splits); a prefix in
    the first and last cap. Why prefixes: session 34's phases lost most in layer3 and layer4 (long K, few
    tiles), so the kernel may pay for the early layers alone, the rest running their own kernels. One at a time:
    each holds its own copy of the weights, so the choice keeps only the one it runs and the fastest so far.
    """
    seen: set[tuple] = set()
    for upto in (None, *stage_ends(net)):
        caps = SPLIT_CAPS if upto is None else (SPLIT_CAPS[0], SPLIT_CAPS[-1])
        if whole_plan.eligible(net, upto) is not None:
            continue
        for flow in (False, True):
            for cap in caps:
                plan = whole_plan.build(
                    net, batch, programs, cap, BARRIER, warps=WARPS, stages=STAGES, flow=flow, upto=upto
                )
                key = (upto, flow, *plan.table[:, whole.COL["split"]].tolist())
                if key not in seen:
                    seen.add(key)
                    yield plan


def stage_ends(net: QuantNet) -> list[str]:
    """The last convolution of each stage but the last (``layer1.2.conv3`` …), in order: the prefixes' ends."""
    names = list(net.convs)  # the convolutions after the stem, in the graph's order
    return [a for a, b in zip(names, names[1:], strict=False) if a.split(".")[0] != b.split(".")[0]]


def check_plan(
    net: QuantNet, plan: whole_plan.Plan, x: torch.Tensor, programs: int | None = None
) -> str | None:
    """None when every layer of one launch on the stem output ``x`` matches its exact reference, else why not.

    Each layer is held to `layers.conv_reference` on the plan's own input and residual (so an error names
    its layer, not the end of the chain), with the tuner's rule (`tuning._agree`); then the barrier flag.
    """
    from deepgap.measure.quant.tuning import _agree

    plan.run(x, programs)
    seen = {plan.input: x}
    for name in plan.names:
        layer = net.convs[name]
        n = layer.node
        h, w, _ = net.shapes[n.inp]
        ref = layers.conv_reference(
            layer, seen[n.inp], (plan.batch, h, w), seen[n.residual] if n.residual else None
        )
        got = plan.view(n.out)
        why = _agree(got, ref, layer.out_fmt)
        if why is not None:
            return f"{name}: {why}"
        seen[n.out] = got
    if plan.flagged():
        return "a grid barrier gave up waiting (its programs were not all resident)"
    return None


def choose_whole(
    net: QuantNet, batch: int, resolution: int, device, on: bool, reps: int = 20
) -> dict[str, Any]:
    """Check and time the plans against the per-layer network; set ``net.whole`` to the kept plan, if any.

    Returns engine_info's ``whole``: ``mode`` ('on', or why none was offered), each plan's label and seconds
    or why it failed its check, the per-layer network's seconds, and the plan kept (None: per layer).
    """
    from deepgap.measure.quant.tuning import checked_time, time_s

    dev = torch.device(device)
    why = _not_offered(net, batch, dev, on)
    if why is not None:
        return {"mode": why}
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    images = torch.randn(batch, 3, resolution, resolution, device=dev).half()
    images = images.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        x = net.run_stem(images, net.stem_backend).contiguous()
        per_layer = time_s(lambda: net.forward(images), reps, str(dev))
        seconds: dict[str, float | str] = {}
        best: tuple[float, whole_plan.Plan] | None = None
        for plan in plans(net, batch, programs):
            net.whole = plan
            got = checked_time(
                lambda plan=plan: check_plan(net, plan, x), lambda: net.forward(images), reps, dev
            )
            net.whole = None
            seconds[plan.label] = got
            if not isinstance(got, str) and (best is None or got < best[0]):
                best = (got, plan)
    kept = best is not None and best[0] <= per_layer * (1 - MARGIN)
    if kept:
        net.whole = best[1]
    return {
        "mode": "on",
        "per_layer_s": per_layer,
        "seconds": seconds,
        "kept": best[1].label if kept else None,
        "whole_s": best[0] if kept else None,
    }


def label_layers(timings: list, plan: whole_plan.Plan | None) -> None:
    """Say in each layer's tile text that the network runs it inside the whole-network kernel (the kept ``plan``).

    A layer's time stays its time alone (its own tuned tile): the per-layer table's rows are each kernel
    against its roof; the network's time is the answer's.
    """
    if plan is None:
        return
    inside = set(plan.names)
    for t in timings:
        if t.name in inside:
            t.config = f"{t.config} (alone); the network runs it in the whole-network kernel"


def _not_offered(net: QuantNet, batch: int, dev: torch.device, on: bool) -> str | None:
    """Why the kernel is not tried here (None: it is)."""
    if not (on and offered()):  # a bad DEEPGAP_QUANT_WHOLE stops the run before it starts
        return "off"
    if dev.type != "cuda":
        return "not on a GPU"
    if batch > MAX_BATCH:
        return f"batch {batch} > {MAX_BATCH}"
    why = whole_plan.eligible(net)
    if why is not None and all(whole_plan.eligible(net, end) is not None for end in stage_ends(net)):
        return f"not eligible: {why}"  # neither the whole network nor a prefix of it
    return None
