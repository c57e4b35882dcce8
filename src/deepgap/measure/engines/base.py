"""The engine interface: three small methods, hardware passed in, heavy imports inside them."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from deepgap.core.records import input_kind
from deepgap.core.registry import Registry

if TYPE_CHECKING:
    import torch

    from deepgap.core.precision import DeviceCaps
    from deepgap.core.records import ConfigSpec


@dataclass
class Prepared:
    """A model made ready by an engine.

    ``run(x)`` takes the input batch on the device (in ``input_dtype``) and returns logits;
    ``setup_s`` is the time spent preparing (export, compile, capture, calibration), kept out of
    the timed window and stored as its own metric.

    ``make_input(x)``: the engine's resident input made from the fp32 example batch already on the
    device; called once, outside the timed window, for a configuration with an ``input_mode``
    (``int8-resident``: the images quantized to int8 in the engine's own layout, as MLPerf times them).
    ``run`` then takes what it returned. None: the engine has no resident input.

    ``faults()``: asked after the timed runs, what went wrong in them that the outputs do not show (a kernel's
    wait that gave up and flagged it), else None; the configuration is then an error, never a stored number.
    """

    run: Callable[[torch.Tensor], torch.Tensor]
    input_dtype: torch.dtype
    setup_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    make_input: Callable[[torch.Tensor], torch.Tensor] | None = None
    faults: Callable[[], str | None] | None = None


class Engine(abc.ABC):
    """One way of executing a model."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    precisions: ClassVar[tuple[str, ...]] = ("fp32", "tf32", "fp16", "bf16")
    inputs: ClassVar[tuple[str, ...]] = ("default",)  # `deepgap.core.records.INPUT_MODES` it accepts

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        """``options`` are the sweep's free-form extras (``SweepSpec.options``), e.g. ``calibration_dir``."""
        self.options: dict[str, Any] = dict(options or {})

    def available(self) -> str | None:
        """Why this engine cannot run in this Python environment at all (a missing package), or None."""
        return None

    def supports(self, spec: ConfigSpec, caps: DeviceCaps) -> str | None:
        """Why this engine cannot run ``spec`` on this device, or None when it can."""
        if spec.precision not in self.precisions:
            return f"engine {self.name} does not run {spec.precision} (it runs {', '.join(self.precisions)})"
        if spec.input_mode and input_kind(spec.input_mode) not in self.inputs:
            kind = input_kind(spec.input_mode)
            return f"engine {self.name} has no {kind} input (it takes {', '.join(self.inputs)})"
        return None

    @abc.abstractmethod
    def prepare(self, model: torch.nn.Module, spec: ConfigSpec, example: torch.Tensor) -> Prepared:
        """Make ``model`` (fp32, eval, on the CPU) runnable for ``spec``; ``example`` is an fp32 input batch.

        Runs inside the worker process; may take long (compilation), never inside the timed window.
        """


def example_on(example: torch.Tensor, device: str, dtype: torch.dtype) -> torch.Tensor:
    """``example`` on ``device``, floats in ``dtype``; a text model's token ids (int64) keep their type."""
    return example.to(device=device, dtype=dtype) if example.is_floating_point() else example.to(device)


ENGINES: Registry[type[Engine]] = Registry("engine")
