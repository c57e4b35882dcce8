"""A model's cost per image for the roofline: FLOPs, parameters and bytes moved, at a precision.

The counting itself is `deepgap.measure.models.flops` (the one FLOP counter, which the worker's ``flops_per_image``
also comes from); this module turns its counts into a device-independent `ModelCost`:

- **Bytes** are an estimate, from the counter's tensor *elements* (bytes = elements × the precision's size):
  every non-view op reads its tensor inputs once and writes its outputs once ("eager traffic", what an
  unfused eager step streams through device memory when nothing stays in cache), and a lower bound
  ("minimum bytes": weights read once, input read and logits written once; training also writes the
  updated weights once).

Counting runs on the ``meta`` device (shapes only, no arithmetic) at batch 1 and 2; FLOPs and traffic are
linear in the batch, so the two counts separate the per-image part from the fixed (weight) part exactly.
Counting builds the model in torch (imported at the top), so the parent's report and comparison import this
module only inside the functions that count, never on a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from deepgap.measure.models.build import build_model, build_skeleton, example_batch
from deepgap.measure.models.flops import count_step, op_counter
from deepgap.measure.models.inputs import elements_per_sample
from deepgap.measure.models.registry import resolve_model
from deepgap.roofline.cost import ITEMSIZE_BYTES, ModelCost  # noqa: F401  (re-exported: the counter's record)


def cost_of_module(model, name: str, resolution: int, mode: str = "infer", device: str = "meta") -> ModelCost:
    """Count ``model`` at batch 1 and 2 on ``device`` (``meta``: shapes only) and fit the linear cost."""
    model = model.to(device)
    counts = []
    out_elems = 0
    for b in (1, 2):
        x = example_batch(name, b, resolution, device=device)  # images, or a text model's token ids
        counts.append(count_step(model, x, mode))
        if b == 1:
            with torch.no_grad():
                out_elems = int(model.eval()(x).numel())
    c1, c2 = counts
    per_image = c2.traffic_elements - c1.traffic_elements
    return ModelCost(
        model=name,
        resolution=resolution,
        mode=mode,
        flops_per_image=c2.flops - c1.flops,
        ew_flops_per_image=c2.ew_flops - c1.ew_flops,
        params=sum(p.numel() for p in model.parameters()),
        buffers=sum(b.numel() for b in model.buffers()),
        input_elements_per_image=elements_per_sample(name, resolution),
        output_elements_per_image=out_elems,
        traffic_elements_per_image=per_image,
        traffic_elements_fixed=max(c1.traffic_elements - per_image, 0.0),
        counted_on=device,
        notes={"ops_per_step_batch1": c1.n_ops, "fixed_flops": c1.flops - (c2.flops - c1.flops)},
    )


@functools.lru_cache(maxsize=64)
def model_cost(name: str, resolution: int | None = None, mode: str = "infer") -> ModelCost:
    """`ModelCost` of a registered deepgap model (meta device; falls back to the CPU if meta fails)."""
    res = resolution or resolve_model(name).default_resolution
    try:  # built on the meta device: no weights to initialise (seconds per ResNet on the CPU)
        return cost_of_module(build_skeleton(name, res), name, res, mode, "meta")
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return cost_of_module(build_model(name, res), name, res, mode, "cpu")


def op_costs(model: str, resolution: int) -> tuple[Any, Any, Any, Any]:
    """Per-op FLOPs and read+write elements of one inference pass at batch 1 and 2 (meta device)."""
    net = build_skeleton(model, int(resolution))
    out = []
    for b in (1, 2):
        counter = op_counter()
        with torch.no_grad(), counter:
            net(torch.empty(b, 3, int(resolution), int(resolution), device="meta"))
        out.append(counter.records)
    if len(out[0]) != len(out[1]):
        raise ValueError("the op sequence differs between batch 1 and 2")
    f1, f2 = (np.array([r.flops for r in recs]) for recs in out)
    e1, e2 = (np.array([r.read_elements + r.write_elements for r in recs]) for recs in out)
    return f1, f2, e1, e2
