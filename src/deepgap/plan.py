"""Expand a validated `SweepSpec` into the ordered list of `ConfigSpec` points (pure).

Order: sweep passes outermost (each runs in its own worker process, `runner.SweepRunner`); inside
a pass, configuration groups (precision × model × memory format × engine × threads; × sequence length for
a text model, whose memory format does not apply) in the paper's
Algorithm 1 order for the first pass and shuffled for later ones (seeded by ``spec.seed`` and the
pass, so the plan stays a pure, reproducible function), so that a slow drift of the machine (heat,
clocks) does not line up with the same configurations in every pass; batch sizes ascend inside a
group, so that an out-of-memory at batch B can skip the larger batches of the same group.

An engine is paired only with the precisions it runs, on its own axes where the sweep sets them
(`deepgap.pairing`, which `config.validate` checks with too). What a *device* cannot run (fp8 below
compute capability 8.9, …) still becomes a stored ``skipped`` row with its reason: that is a finding,
not a planning error.
"""

from __future__ import annotations

import itertools
import random

from deepgap.config import SweepSpec
from deepgap.models import resolve_model
from deepgap.pairing import axes, check_pairs
from deepgap.records import ConfigSpec


def _ordered_union(lists) -> tuple:
    out: list = []
    for values in lists:
        out += [v for v in values if v not in out]
    return tuple(out)


def expand(spec: SweepSpec, device: str) -> list[ConfigSpec]:
    """All configurations of ``spec`` on ``device`` (``auto`` must already be resolved)."""
    check_pairs(spec)
    threads: tuple[int | None, ...] = tuple(spec.threads) if spec.threads else (None,)
    per = {e: axes(spec, e) for e in spec.engines}
    precisions = _ordered_union([spec.precisions, *(a["precisions"] for a in per.values())])
    formats = _ordered_union([spec.memory_formats, *(a["memory_formats"] for a in per.values())])
    out: list[ConfigSpec] = []
    for sweep in range(spec.sweeps):
        groups = [
            g for g in itertools.product(precisions, spec.models, formats, spec.engines, threads)
            if g[0] in per[g[3]]["precisions"] and g[2] in per[g[3]]["memory_formats"]
        ]
        if sweep > 0:  # sweep 0 keeps the paper's order; later ones are shuffled, reproducibly
            order = random.Random(f"{spec.seed}:{sweep}").sample(range(len(groups)), len(groups))
            groups = [groups[i] for i in order]
        for precision, model, mf, engine, t in groups:
            entry = resolve_model(model)
            if entry.is_text and mf != per[engine]["memory_formats"][0]:
                continue  # a token batch has no memory format: one group per engine, stored as "nchw"
            sizes = _sizes(spec, entry)
            for size in sizes:
                for bs in sorted(set(per[engine]["batch_sizes"])):
                    out.append(
                        ConfigSpec(
                            model=model, engine=engine, precision=precision, batch_size=bs, device=device,
                            memory_format="nchw" if entry.is_text else mf, threads=t, resolution=size,
                            sweep=sweep, include_transfer=spec.include_transfer,
                            seq_len=size if entry.is_text else None,
                        )
                    )
    return out


def _sizes(spec: SweepSpec, entry) -> tuple[int, ...]:
    """Input sizes of one model: its sequence lengths (``seq_lens``) for a text model, else its resolution.

    A text model's sequence length is also its ``resolution`` (see `records.ConfigSpec`).
    """
    if entry.is_text:
        return tuple(dict.fromkeys(spec.seq_lens)) or (entry.default_resolution,)
    return (spec.resolution or entry.default_resolution,)
