"""Whether the quant network's CUDA graph runs its shortcut convolutions on a second stream (`quant.branch`).

Why timed, not assumed: at batch 1 a downsample beside the block's conv1 and conv2 takes its 4-6 µs off the
critical path, but the fork and join are graph edges of their own, and the two paths share the SMs. So, as
for PDL (`pdl_choice`), `prepare_quant` captures the network both ways and keeps the faster graph; the two must
give the same logits bit for bit (the same kernels). ``info["branch"]`` says what was timed.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from deepgap.measure.quant import branch
from deepgap.measure.quant.tuning import time_s

MAX_BATCH = 8  # where the kernels leave SMs idle enough for a branch to run beside the main path
MIN_GAIN = 0.01  # kept when at least this much faster (as `pdl_choice`)


def choose(net: Any, runner: Any, static_x: torch.Tensor, device: str, pdl: bool) -> tuple[Any, dict | None]:
    """``(runner, info)``: ``runner`` or a capture with the side stream, whichever is kept (None: not offered).

    ``pdl``: capture under programmatic dependent launch, as the kept ``runner`` was.
    """
    from deepgap.measure import graph_runner
    from deepgap.measure.quant import launch

    names = [n for n, _ in net.steps(static_x.shape[0])]
    sched = branch.schedule(net.graph, names, net.stem.out, branch.skip_of(net))
    offered = torch.device(device).type == "cuda" and static_x.shape[0] <= MAX_BATCH  # one stream elsewhere
    if branch.mode() == "off" or not offered or not sched.side:
        return runner, None
    info: dict[str, Any] = {"side": [names[i] for i in sorted(sched.side)], "chosen": False}
    net.side = torch.cuda.Stream(torch.device(device))
    try:
        with launch.pdl() if pdl else contextlib.nullcontext():
            graph, out = graph_runner.capture(net.forward, static_x, device, warmup=2)
        branched = graph_runner.GraphRunner(graph, static_x, out, owns=net)
        with torch.inference_mode():
            same = torch.equal(branched(static_x), runner(static_x).clone())
    except Exception as exc:  # noqa: BLE001 - the serial graph still works
        torch.cuda.synchronize(device)
        net.side = None
        return runner, {**info, "error": f"{type(exc).__name__}: {exc}"[:300]}
    net.side = None  # an eager forward after this runs serially; the kept graph has the branches
    if not same:
        return runner, {**info, "error": "the branched graph's logits differ from the serial graph's"}
    serial = time_s(lambda: runner(static_x), reps=20, device=device, use_graph=False)
    both = time_s(lambda: branched(static_x), reps=20, device=device, use_graph=False)
    keep = both < serial * (1 - MIN_GAIN)
    return (branched if keep else runner), {
        **info,
        "chosen": keep,
        "seconds": {"serial": serial, "branched": both},
    }
