"""Expand a validated `SweepSpec` into the ordered list of `ConfigSpec` points (pure).

Order: sweep passes outermost (each runs in its own worker process, `runner.SweepRunner`); inside
a pass, configuration groups (precision × model × memory format × engine × threads) in the seed's
Algorithm 1 order for the first pass and shuffled for later ones (seeded by ``spec.seed`` and the
pass, so the plan stays a pure, reproducible function), so that a slow drift of the machine (heat,
clocks) does not line up with the same configurations in every pass; batch sizes ascend inside a
group, so that an out-of-memory at batch B can skip the larger batches of the same group.

An engine is paired only with the precisions it runs (``Engine.precisions`` in the engine
registry): crossing every engine with every precision stored 8 "does not run" rows out of 12 for
``--engines compile-freeze,quant --precisions fp16,int8,fp8``. Each engine takes its axes from
``spec.engine_axes`` where set (a default grid gives compiled engines fewer batch sizes), else from
the sweep. A precision, or an engine, left with no partner is a `UsageError` (`check_pairs`), never
an empty or silently shrunk sweep. What a *device* cannot run (fp8 below compute capability 8.9, …)
still becomes a stored ``skipped`` row with its reason: that is a finding, not a planning error.
"""

from __future__ import annotations

import itertools
import random

from deepgap.config import SweepSpec
from deepgap.errors import UsageError
from deepgap.models import resolve_model
from deepgap.records import ConfigSpec


def engine_precisions(engine: str) -> tuple[str, ...]:
    """The precisions the registered engine ``engine`` runs."""
    from deepgap.engines import load_engines
    from deepgap.engines.base import ENGINES

    load_engines()
    return tuple(ENGINES.get(engine).precisions)


def axes(spec: SweepSpec, engine: str) -> dict[str, tuple]:
    """``engine``'s precisions (only those it runs), batch sizes and memory formats in ``spec``."""
    own = spec.engine_axes.get(engine, {})
    out = {a: tuple(own[a]) if a in own else tuple(getattr(spec, a)) for a in ("precisions", "batch_sizes",
                                                                                "memory_formats")}
    runs = engine_precisions(engine)
    out["precisions"] = tuple(p for p in out["precisions"] if p in runs)
    return out


def check_pairs(spec: SweepSpec) -> None:
    """A `UsageError` for a precision no chosen engine runs, or an engine that runs none of its precisions."""
    per_engine = {e: axes(spec, e)["precisions"] for e in spec.engines}
    for p in spec.precisions:
        if not any(p in ps for ps in per_engine.values()):
            from deepgap.engines.base import ENGINES

            able = [e for e in ENGINES.names() if p in engine_precisions(e)]
            raise UsageError(
                f"no chosen engine runs {p} (engines: {', '.join(spec.engines)})",
                f"add an engine that does ({', '.join(able) or 'none registered'}) "
                f"or drop {p} from --precisions",
            )
    for e, ps in per_engine.items():
        if not ps:
            asked = spec.engine_axes.get(e, {}).get("precisions", spec.precisions)
            raise UsageError(
                f"engine {e} runs none of the chosen precisions ({', '.join(asked)}); it runs "
                f"{', '.join(engine_precisions(e))}",
                f"add one of those with --precisions, or drop {e} from --engines",
            )


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
        if sweep > 0:  # sweep 0 keeps the seed's order; later ones are shuffled, reproducibly
            order = random.Random(f"{spec.seed}:{sweep}").sample(range(len(groups)), len(groups))
            groups = [groups[i] for i in order]
        for precision, model, mf, engine, t in groups:
            resolution = spec.resolution or resolve_model(model).default_resolution
            for bs in sorted(set(per[engine]["batch_sizes"])):
                out.append(
                    ConfigSpec(
                        model=model, engine=engine, precision=precision, batch_size=bs, device=device,
                        memory_format=mf, threads=t, resolution=resolution, sweep=sweep,
                        include_transfer=spec.include_transfer,
                    )
                )
    return out
