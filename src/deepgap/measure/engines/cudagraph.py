"""CUDA graphs: the eager model captured once per batch size, replayed in the timed loop.

Why: at small batches a ResNet on a fast GPU is launch-bound — the host issues ~150 kernel launches
per image batch and the GPU idles between them. A captured graph replays all of them with one
launch. Shapes are static, so each configuration captures its own graph from the example batch
that ``prepare`` receives. The graph reads a static input buffer: each call copies the caller's
batch into it (a device-to-device copy, as a serving system does), then replays.
"""

from __future__ import annotations

import time

from deepgap.core.precision import float_precision_support
from deepgap.core.records import TEXT_INPUTS
from deepgap.measure.device import torch_dtype
from deepgap.measure.engines.base import ENGINES, Engine, Prepared, example_on
from deepgap.measure.engines.eager import to_device

WARMUP_CALLS = 3  # before capture, on a side stream: cuDNN picks its algorithms, lazy inits happen


@ENGINES.register("cudagraph")
class CudaGraphEngine(Engine):
    """``torch.cuda.CUDAGraph`` of the eager model (NCHW or channels_last)."""

    name = "cudagraph"
    inputs = ("default", *TEXT_INPUTS)  # a mixed-length text batch: fixed lengths, so one graph per batch
    description = (
        "PyTorch eager captured as a CUDA graph per batch size (the small-batch latency winner); GPU"
    )

    def supports(self, spec, caps):  # noqa: D102
        why = super().supports(spec, caps) or float_precision_support(spec.precision, caps)
        if why:
            return why
        if caps.kind != "cuda":
            return "cudagraph captures CUDA kernel launches; it needs a CUDA GPU (this device is a CPU)"
        return None

    def prepare(self, model, spec, example):  # noqa: D102
        from deepgap.measure import graph_runner

        t0 = time.perf_counter()
        model = to_device(model, spec)
        # keeps channels_last strides; a normal (not inference) tensor: `run` may copy into it anywhere
        static_in = example_on(example, spec.device, torch_dtype(spec.precision))
        t1 = time.perf_counter()
        graph, static_out = graph_runner.capture(model, static_in, spec.device, warmup=WARMUP_CALLS)
        capture_s = time.perf_counter() - t1
        # the runner owns the model: the graph reads its weights by address (see graph_runner)
        run = graph_runner.GraphRunner(graph, static_in, static_out, owns=model)
        info = {"capture_s": capture_s, "warmup_calls": WARMUP_CALLS, "static_input": "copied in each call"}
        return Prepared(run=run, input_dtype=static_in.dtype, setup_s=time.perf_counter() - t0, info=info)
