"""Which precisions, batch sizes and memory formats each engine of a sweep gets (pure, no torch).

An engine is paired only with the precisions it runs (``Engine.precisions`` in the engine
registry): crossing every engine with every precision stored 8 "does not run" rows out of 12 for
``--engines compile-freeze,quant --precisions fp16,int8,fp8``. Each engine takes its axes from
``spec.engine_axes`` where set (a default grid gives compiled engines fewer batch sizes), else from
the sweep. Input modes (``spec.inputs``, `deepgap.core.records.INPUT_MODES`) pair the same way: an engine
gets only the inputs it takes (``Engine.inputs``). A precision, an input, or an engine, left with no
partner is a `UsageError` (`check_pairs`), never an empty or silently shrunk sweep. `config.validate`
checks the pairs and `plan.expand` crosses them, so this module sits below both (it reads a
`SweepSpec`, it does not import one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from deepgap.core.errors import UsageError


class SweepSpec(Protocol):
    """What pairing reads of a sweep (`deepgap.drive.config.SweepSpec` has it; this layer sits below)."""

    engines: Sequence[str]
    precisions: Sequence[str]
    batch_sizes: Sequence[int]
    memory_formats: Sequence[str]
    models: Sequence[str]
    inputs: Sequence[str]
    engine_axes: dict[str, dict[str, Any]]


def engine_precisions(engine: str) -> tuple[str, ...]:
    """The precisions the registered engine ``engine`` runs."""
    from deepgap.measure.engines.catalog import engine_info

    return engine_info(engine).precisions


def engine_inputs(engine: str) -> tuple[str, ...]:
    """The input modes the registered engine ``engine`` takes."""
    from deepgap.measure.engines.catalog import engine_info

    return engine_info(engine).inputs


def axes(spec: SweepSpec, engine: str) -> dict[str, tuple]:
    """``engine``'s precisions and inputs (only those it runs), batch sizes, memory formats and models in ``spec``."""
    own = spec.engine_axes.get(engine, {})
    out = {
        a: tuple(own[a]) if a in own else tuple(getattr(spec, a))
        for a in ("precisions", "batch_sizes", "memory_formats", "models")
    }
    runs = engine_precisions(engine)
    out["precisions"] = tuple(p for p in out["precisions"] if p in runs)
    takes = engine_inputs(engine)
    out["inputs"] = tuple(i for i in spec.inputs if i in takes)
    return out


def check_pairs(spec: SweepSpec) -> None:
    """A `UsageError` for a precision (or input) no chosen engine runs, or an engine that runs none of its own."""
    _check_inputs(spec)
    per_engine = {e: axes(spec, e)["precisions"] for e in spec.engines}
    for p in spec.precisions:
        if not any(p in ps for ps in per_engine.values()):
            from deepgap.measure.engines.catalog import engine_names

            able = [e for e in engine_names() if p in engine_precisions(e)]
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


def _check_inputs(spec: SweepSpec) -> None:
    """As `check_pairs` for the input modes: each one taken by some engine, each engine taking one."""
    from deepgap.measure.engines.catalog import engine_names

    per_engine = {e: tuple(i for i in spec.inputs if i in engine_inputs(e)) for e in spec.engines}
    for i in spec.inputs:
        if not any(i in ins for ins in per_engine.values()):
            able = [e for e in engine_names() if i in engine_inputs(e)]
            raise UsageError(
                f"no chosen engine takes the {i} input (engines: {', '.join(spec.engines)})",
                f"add an engine that does ({', '.join(able) or 'none registered'}) or drop {i} from --inputs",
            )
    for e, ins in per_engine.items():
        if not ins:
            raise UsageError(
                f"engine {e} takes none of the chosen inputs ({', '.join(spec.inputs)}); it takes "
                f"{', '.join(engine_inputs(e))}",
                f"add one of those with --inputs, or drop {e} from --engines",
            )
