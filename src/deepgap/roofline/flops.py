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
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from deepgap.core.precision import column
from deepgap.measure.models.build import build_model, build_skeleton, example_batch
from deepgap.measure.models.flops import count_step, op_counter
from deepgap.measure.models.inputs import elements_per_sample
from deepgap.measure.models.registry import resolve_model

ITEMSIZE_BYTES = column("itemsize")  # bytes per element, a live view of the precision table


@dataclass(frozen=True)
class ModelCost:
    """What a model costs per image, independent of the device (element counts; bytes via a precision)."""

    model: str
    resolution: int
    mode: str  # infer | train
    flops_per_image: float  # flop_counter convention; train = forward + backward (+ 0 for the update)
    ew_flops_per_image: float  # elementwise estimate (not part of flops_per_image)
    params: int
    buffers: int
    input_elements_per_image: int
    output_elements_per_image: int
    traffic_elements_per_image: float  # eager-traffic estimate, part that scales with the batch
    traffic_elements_fixed: float  # part independent of the batch (weights, their gradients, the update)
    counted_on: str = "meta"
    notes: dict[str, Any] = field(default_factory=dict)

    def flops(self, batch_size: int) -> float:
        """FLOPs of one step (inference pass or training step) at ``batch_size``."""
        return self.flops_per_image * batch_size

    def param_bytes(self, precision: str = "fp32") -> float:
        """Parameter bytes at ``precision``."""
        return self.params * ITEMSIZE_BYTES[precision]

    def min_bytes(self, batch_size: int, precision: str = "fp32") -> float:
        """Lower bound on device-memory traffic of one step (perfect on-chip reuse).

        Inference: weights read once, inputs read, logits written. Training: weights read once and updated
        weights written once (gradients never leave the chip), inputs read, logits written.
        """
        w = self.params * (2 if self.mode == "train" else 1)
        io = batch_size * (self.input_elements_per_image + self.output_elements_per_image)
        return float(w + io) * ITEMSIZE_BYTES[precision]

    def traffic_bytes(self, batch_size: int, precision: str = "fp32") -> float:
        """Eager-traffic estimate of one step: each non-view op reads its inputs, writes its outputs once."""
        return (self.traffic_elements_fixed + batch_size * self.traffic_elements_per_image) * ITEMSIZE_BYTES[
            precision
        ]

    def intensity(self, batch_size: int, precision: str = "fp32", bytes_model: str = "traffic") -> float:
        """Arithmetic intensity (FLOP/byte) with ``bytes_model`` ``traffic`` (default) or ``min``."""
        b = (
            self.traffic_bytes(batch_size, precision)
            if bytes_model == "traffic"
            else self.min_bytes(batch_size, precision)
        )
        return self.flops(batch_size) / b if b else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for the store)."""
        return asdict(self)


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
