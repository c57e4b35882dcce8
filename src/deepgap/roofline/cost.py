"""A model's cost per image (`ModelCost`), and the committed table of the counts the report needs.

`ModelCost` is the record `deepgap.roofline.flops` counts (on the meta device, in torch); it lives here,
torch-free, so that the parent can read counted costs without importing torch. Why a table: the report's
rooflines need the cost of every model in a store, and counting one means importing torch and
torchvision and building the model (about 15 CPU-s in a fresh process on the 2-core CI machine, most of a
small report's build). The count is deterministic per model, resolution, mode and torch version, so the
costs of the models the project measures are kept in ``data/model_costs.json``, with the torch version
they were counted with; under another torch (or for any other model) the caller counts (`known` is None).
``tests/roofline/test_roofline_flops.py`` holds the table to a fresh count (``DEEPGAP_REGEN_GOLDEN=1`` rewrites it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata, resources
from typing import Any

from deepgap.core.precision import column

TABLE = "model_costs.json"  # in deepgap/data
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


def torch_version() -> str | None:
    """The installed torch's version, read from its metadata (importing torch costs seconds)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def table() -> dict[tuple[str, int, str], ModelCost]:
    """The committed costs, by (model, resolution, mode); empty when counted under another torch."""
    data = json.loads(resources.files("deepgap").joinpath("data", TABLE).read_text(encoding="utf-8"))
    if data.get("torch") != torch_version():
        return {}
    return {(c["model"], int(c["resolution"]), c["mode"]): ModelCost(**c) for c in data["costs"]}


def known(name: str, resolution: int, mode: str = "infer") -> ModelCost | None:
    """The committed `ModelCost` of ``name`` at ``resolution`` and ``mode``, or None (then count it)."""
    return table().get((str(name), int(resolution), str(mode)))


def table_json(costs: list[ModelCost]) -> str:
    """The table file's text for ``costs`` counted under the installed torch (what `table` reads)."""
    rows = [c.to_dict() for c in sorted(costs, key=lambda c: (c.model, c.resolution, c.mode))]
    return json.dumps({"torch": torch_version(), "costs": rows}, indent=1) + "\n"
