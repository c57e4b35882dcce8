"""Whether the quant network's CUDA graph launches its Triton kernels with programmatic dependent launch.

Why timed, not assumed: PDL (`quant.launch.pdl`) lets each kernel launch while its predecessor finishes,
which hides launch latency where kernels are short (batch 1: 54 kernels of 2–10 µs) but lets a waiting
kernel's blocks hold SM slots during its predecessor's last wave, which can cost at large batches. So
`prepare_quant` captures the network both ways and keeps the faster graph, and ``info["pdl"]`` says
what was timed. The two graphs must give the same logits bit for bit (the same kernels in the same
order); a PDL graph that does not, or fails to capture, is not used.
"""

from __future__ import annotations

from typing import Any

import torch

from deepgap.core import switches
from deepgap.measure.quant.tuning import time_s

PDL_MODES = switches.choices("DEEPGAP_DECODE_PDL")  # auto, on, off
MIN_GAIN = 0.01  # PDL is kept when it is at least this much faster (the timings' own noise is below it)
MIN_CC = (9, 0)  # griddepcontrol: Hopper and later


def decode_modes(dev: torch.device) -> tuple[bool, ...]:
    """A decode graph's launch modes to capture: plain, PDL, or both to time (``DEEPGAP_DECODE_PDL``, Hopper).

    Here, beside the CNN engine's choice, because the GEMV tuner asks it too (`gemv.timed_under_pdl`).
    """
    mode = switches.read("DEEPGAP_DECODE_PDL")
    if mode == "off" or torch.cuda.get_device_capability(dev) < MIN_CC:
        return (False,)
    return (True,) if mode == "on" else (False, True)


def choose_pdl(net: Any, runner: Any, static_x: torch.Tensor, device: str, mode: str = "auto"):
    """``(runner, info)``: the plain graph ``runner`` or a PDL capture of ``net.forward``, whichever is kept.

    ``info`` is None when ``mode`` is 'off' (nothing captured or timed).
    """
    from deepgap.measure import graph_runner
    from deepgap.measure.quant import launch

    if mode not in PDL_MODES:
        raise ValueError(f"pdl must be one of {PDL_MODES}; got {mode!r}")
    if mode == "off":
        return runner, None
    cc = torch.cuda.get_device_capability(torch.device(device))
    if cc < MIN_CC:
        return runner, {
            "chosen": False,
            "reason": f"needs compute capability ≥ 9.0; this GPU has {cc[0]}.{cc[1]}",
        }
    try:
        with launch.pdl():
            graph, out = graph_runner.capture(net.forward, static_x, device, warmup=2)
        pdl_runner = graph_runner.GraphRunner(graph, static_x, out, owns=net)
        with torch.inference_mode():
            plain_out = runner(static_x).clone()
            same = torch.equal(pdl_runner(static_x), plain_out)
    except Exception as exc:  # noqa: BLE001 - the plain graph still works
        torch.cuda.synchronize(device)
        return runner, {"chosen": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if not same:
        return runner, {"chosen": False, "error": "the PDL graph's logits differ from the plain graph's"}
    reps = 20
    off = time_s(lambda: runner(static_x), reps=reps, device=device, use_graph=False)
    on = time_s(lambda: pdl_runner(static_x), reps=reps, device=device, use_graph=False)
    keep = mode == "on" or on < off * (1 - MIN_GAIN)
    info = {"chosen": keep, "seconds": {"off": off, "on": on}, "mode": mode}
    info["trigger"] = launch.trigger()  # before or after each kernel's wait (`gdc`)
    # each kernel's epilogue constants before its wait or after its K loop (`launch.constants_ahead`)
    info["constants"] = switches.read("DEEPGAP_PDL_CONSTANTS")
    return (pdl_runner if keep else runner), info
