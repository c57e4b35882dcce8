"""A captured CUDA graph made callable, owning every tensor its kernels read.

Why this exists: a CUDA graph records raw device addresses, not Python references. A runner that
replays a graph but lets the network it was captured from be garbage-collected replays kernels
over freed memory: the caching allocator hands those blocks to the next tensor, so a replay either
faults ("an illegal memory access") or — worse — silently computes with whatever was written
there since. The quant engine's first runner was a closure over the graph and its static buffers
only; `deepgap serve`, which keeps one runner per batch size and drops the engine's result object,
faulted at its second batch size. `GraphRunner` therefore holds the graph, its static input and
output, and an ``owns`` reference to the object whose tensors the graph reads (the network).

`capture` is the one place that records a graph (side-stream warm-up, then capture), so every
graph-capturing engine builds its runner the same way; tests on a CPU replace it with a recorder.
It lives in the core below both `deepgap.measure.engines` and `deepgap.measure.quant`, since both capture graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

WARMUP_CALLS = 3  # before capture, on a side stream: cuDNN picks its algorithms, lazy inits happen


def can_capture(device: str) -> bool:
    """Whether ``device`` is a CUDA device on which a graph can be captured here."""
    if not str(device).startswith("cuda"):
        return False
    return torch.cuda.is_available()


def capture(
    fn: Callable[[Any], Any], static_in: Any, device: str, warmup: int = WARMUP_CALLS
) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, then capture ``fn(static_in)``; returns (graph, static output).

    Runs under ``inference_mode`` and with ``device`` current, on a capture stream of ``device``:
    ``torch.cuda.graph`` otherwise captures on a stream of the *current* device, made once per process,
    and a worker measuring ``cuda:1`` while ``cuda:0`` was current failed its capture ("operation failed
    due to a previous error during capture", issue 34). A failed capture raises (callers decide whether
    eager is a fallback).
    """
    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with torch.inference_mode(), torch.cuda.device(dev):
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(static_in)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device=dev)):
            static_out = fn(static_in)
        graph.replay()
        torch.cuda.synchronize(dev)
    return graph, static_out


class GraphRunner:
    """``run(x)``: copy ``x`` into the graph's static input, replay, return the static output.

    The returned output is overwritten by the next call. ``owns`` (the network, its weights and any
    other tensors the graph reads) lives exactly as long as the runner; see the module docstring.
    """

    def __init__(self, graph: Any, static_in: Any, static_out: Any, owns: Any) -> None:
        self.graph = graph
        self.static_in = static_in
        self.static_out = static_out
        self.owns = owns
        self.capture_device = getattr(static_in, "device", None)  # where it was captured (the worker's guard)

    def __call__(self, x: Any) -> Any:
        """Run the graph on ``x`` (the captured shape; any strides)."""
        if tuple(x.shape) != tuple(self.static_in.shape):
            raise ValueError(
                f"this prepared graph takes inputs of shape {tuple(self.static_in.shape)}; "
                f"got {tuple(x.shape)}"
            )
        if x.data_ptr() != self.static_in.data_ptr():
            self.static_in.copy_(x)
        self.graph.replay()
        return self.static_out


def bound_input(run: Any, x: Any) -> Any:
    """``x``'s values in the graph's own input buffer, where ``run`` is a runner that takes ``x`` as it is; else ``x``.

    Why: a `GraphRunner` copies any other tensor into its static input before each replay: a kernel launch
    outside the graph (a few µs at batch 1) and a pass over the batch (0.6 GB read and written at ResNet-50's
    batch 1024 in fp16) that no deployment with bound input buffers pays. An input that is device-resident
    sits where the engine reads it. Same shape, dtype and device only; the buffer's layout is the graph's.
    """
    static = getattr(run, "static_in", None)
    if not (isinstance(static, torch.Tensor) and isinstance(x, torch.Tensor)):
        return x
    if static is x or (static.shape, static.dtype, static.device) != (x.shape, x.dtype, x.device):
        return x
    static.copy_(x)
    return static
