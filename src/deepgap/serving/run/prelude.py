"""The run-level prelude of ``deepgap serve``: the idle baseline and thermal warm-up of ``deepgap run``.

Why: every kind of run gets them through the one run session (`deepgap.drive.session.RunSession.prelude`,
`deepgap.drive.prelude`), so a serve run's power and clocks are read against the same baseline
and a thermal warm-up means the same thing as in a sweep. The serving worker is the measurement
worker, so it answers the ``idle`` and ``thermal`` requests as a sweep's worker does
(`deepgap.serving.run.process.ServingWorker.prelude`); the parent never touches the device.

Order, and why (`deepgap.serving.run.serve_run`, through the one driver): launch the worker → open the run
with its fingerprint → idle baseline (nothing built yet: the bare device) → thermal warm-up (the served
model at its largest prepared batch up to 64, `warmup_configs`) → build and calibrate → load levels. The
service curve the simulator is fed and the levels are then both measured on the warm device.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from deepgap.core.precision import is_quantized
from deepgap.core.records import ConfigSpec

if TYPE_CHECKING:
    from deepgap.serving.run.process import SetupRequest


def warmup_configs(req: SetupRequest) -> list[ConfigSpec]:
    """The configurations the prelude may warm up with: the first model's build, one per prepared batch.

    A decoder's (``cache_len``) warms up with the eager forward over its longest prompt (a prefill), the
    load every engine's serving runs first; the sweep's engines need not time a decoder's forward. That
    forward keeps no cache, so its configuration names none (an fp8 cache's ``kv_cache`` is left out). Eager
    runs no 8-bit precision, so a quantized decoder (fp8, int8: its rest computes in bf16) warms up in bf16:
    until session 49 its warm-up asked eager for fp8, was refused, and the curves were calibrated cold.
    """
    if req.cache_len:
        return [
            dataclasses.replace(
                req.config(b), engine="eager", kv_cache=None, precision=_eager_precision(req.precision)
            )
            for b in req.buckets
        ]
    return [req.config(b) for b in req.buckets]


def _eager_precision(precision: str) -> str:
    """The precision eager warms a decoder up in: its own, or bf16 for an 8-bit one."""
    return "bf16" if is_quantized(precision) else precision
