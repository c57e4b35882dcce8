"""Expand a validated `SweepSpec` into the ordered list of `ConfigSpec` points (pure).

Order follows the seed's Algorithm 1 — precision, model, sweep, then batch size ascending — so
that an out-of-memory at batch B can skip the larger batches of the same group, and a model is
built once per worker for all its batches.
"""

from __future__ import annotations

import itertools

from deepgap.config import SweepSpec
from deepgap.models import resolve_model
from deepgap.records import ConfigSpec


def expand(spec: SweepSpec, device: str) -> list[ConfigSpec]:
    """All configurations of ``spec`` on ``device`` (``auto`` must already be resolved)."""
    threads: tuple[int | None, ...] = tuple(spec.threads) if spec.threads else (None,)
    out: list[ConfigSpec] = []
    for precision, model, sweep, mf, engine, t in itertools.product(
        spec.precisions, spec.models, range(spec.sweeps), spec.memory_formats, spec.engines, threads
    ):
        resolution = spec.resolution or resolve_model(model).default_resolution
        for bs in sorted(set(spec.batch_sizes)):
            out.append(
                ConfigSpec(
                    model=model, engine=engine, precision=precision, batch_size=bs, device=device,
                    memory_format=mf, threads=t, resolution=resolution, sweep=sweep,
                    include_transfer=spec.include_transfer,
                )
            )
    return out
