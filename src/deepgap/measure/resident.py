"""The resident input of a measurement: the engine's own input made from the fp32 batch on the device.

Why a module of its own: the sweep's measurement (`deepgap.measure.configuration`) and accuracy mode
(`deepgap.measure.accuracy.evaluate`) both feed it, and neither may import the engine registry's
dependencies for it (accuracy mode sits below the engines' calibration data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from deepgap.core.records import ConfigSpec


def resident_input(spec: ConfigSpec, prepared: Any, x_device: torch.Tensor) -> torch.Tensor:
    """``spec.input_mode``'s input: the engine's ``make_input`` of the fp32 batch already on the device.

    ``prepared`` is the engine's `deepgap.measure.engines.base.Prepared` (not imported: see the module).

    Why: MLPerf times int8 images already in GPU memory (its preprocessing is untimed); the engine alone
    knows its own int8 layout. An engine that takes the mode but made no such input is an error row, never
    a silent fall back to the default input (that row would be labelled with a condition it did not have).
    """
    from deepgap.core.records import Status
    from deepgap.measure.protocol import StatusError

    make = getattr(prepared, "make_input", None)
    if make is None:
        raise StatusError(
            Status.ERROR, f"engine {spec.engine} gave no make_input for the {spec.input_mode} input"
        )
    x = make(x_device)
    del x_device
    return x
