"""The sweep specification: typed and validated (the named grids built from it are `deepgap.drive.presets`).

Construction has no side effects (no device probing, no file writes); `validate` raises a
`UsageError` naming the problem and the fix, before anything is written.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.limits import (  # noqa: F401  (MAX_*: re-exported, the ranges' public names)
    FLOAT_LIMITS,
    INT_LIMITS,
    MAX_BATCH,
    MAX_SEED,
    MAX_THREADS,
    check_device,
    check_range,
    is_real,
    toml_example,
    typed_value,
)
from deepgap.core.precision import PRECISIONS
from deepgap.core.records import INPUT_MODES
from deepgap.measure.pairing import check_pairs

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

PAPER_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512)
MEMORY_FORMATS = ("nchw", "channels_last")
# axes `engine_axes` may set per engine; models: a subset of the sweep's (the default grid compiles
# compile-freeze for one model only, so that it fits its 10 minutes on a slower host: presets.py)
ENGINE_AXES = ("precisions", "batch_sizes", "memory_formats", "models")


@dataclass(frozen=True)
class SweepSpec:
    """A whole sweep: the cartesian product of its axes, measured with one protocol.

    Protocol per configuration: ``warmup`` untimed iterations, then ``repeats`` repeats of
    ``iterations`` timed iterations (each followed by a pipelined window of as many iterations).
    With ``target_ci`` set, further repeats run until the median's 95% CI half-width is within
    ``target_ci`` × median or ``max_time_s`` is spent.
    """

    models: tuple[str, ...] = ("resnet50",)
    engines: tuple[str, ...] = ("eager",)
    precisions: tuple[str, ...] = ("fp32",)
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    memory_formats: tuple[str, ...] = ("nchw",)
    threads: tuple[int, ...] = ()  # CPU thread counts to sweep; empty = torch's default
    device: str = "auto"
    resolution: int | None = None  # None = each model's default
    seq_lens: tuple[int, ...] = ()  # text models' sequence lengths to sweep; empty = each one's default (128)
    # "forward" (a timed forward pass, every model) or "decode" (a decoder's greedy generation: TTFT, TPOT,
    # tokens/s; `deepgap.measure.llm_workload`), over input × output lengths (empty: 128 each)
    workload: str = "forward"
    input_lens: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()
    # decode's KV-cache formats (`deepgap.measure.llm_workload.KV_CACHES`): "auto" (the decoder's own dtype)
    # and/or "fp8" (e4m3 codes at scale 1), each its own configurations; decode only
    kv_caches: tuple[str, ...] = ("auto",)
    # how the timed input is given (`deepgap.core.records.INPUT_MODES`): "default" (a float batch on the
    # device) and/or "int8-resident" (int8 images already in GPU memory, MLPerf-like), each its own rows
    inputs: tuple[str, ...] = ("default",)
    # a text input's lengths (`deepgap.core.lengths`; "uniform:64:384", the serve syntax): what "packed" and
    # "padded" (`deepgap.core.records.TEXT_INPUTS`) draw each batch's sequence lengths from
    seq_len_dist: str | None = None
    warmup: int = 20
    iterations: int = 100
    repeats: int = 3
    sweeps: int = 1
    target_ci: float | None = None
    max_time_s: float = 60.0
    min_time_s: float = 0.0  # minimum pipelined window (energy counters need ≥ 1 s)
    timeout_s: float = 900.0
    weights: str | None = None
    seed: int = 0
    include_transfer: bool = False
    cudnn_benchmark: bool = True
    # telemetry (deepgap.measure.telemetry; README.md (Telemetry))
    telemetry: bool = True  # sample power/energy/temperature/clocks/throttling during every measurement
    sample_hz: float = 10.0  # telemetry samples per second inside energy windows (1/10 of it elsewhere)
    energy_window_s: float = 1.0  # with an energy counter, each pipelined window lasts at least this
    idle_s: float = 2.0  # idle-baseline power measured this long at run start
    thermal_warmup: bool = False  # run load until the temperature is steady before measuring
    thermal_window_s: float = 30.0  # steady: |temperature slope| over this window below the threshold
    thermal_slope_c_per_min: float = 1.0
    thermal_timeout_s: float = 300.0
    # per-engine axes replacing the sweep's own for that engine, e.g. {"quant": {"batch_sizes": (256,)}}:
    # compiling costs ~20 s per shape, so a grid that fits a time budget gives it fewer batch sizes than eager
    engine_axes: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict, hash=False)
    options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # accuracy mode (deepgap.measure.accuracy; README.md (Accuracy mode))
    dataset: str | None = (
        None  # ImageFolder tree or CSV of path,label; validate() stores its identity in options
    )
    accuracy_samples: int | None = None  # score this many evaluation images (None: the whole split)
    min_accuracy: float | None = (
        None  # top-1 relative to fp32; None: 99% for int8/fp8 (MLPerf), none otherwise
    )
    # the host CPU measured after a GPU sweep, in the same run (docs/cpu-baseline.md; `cpu_baseline_spec`)
    cpu_baseline: bool = False
    cpu_cores: int | None = None  # its "all cores": set when the run starts, so a resume plans the same grid

    def replace(self, **changes: Any) -> SweepSpec:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def overlay(self, **changes: Any) -> SweepSpec:
        """``replace``, where an axis set here also leaves every `engine_axes` entry.

        A flag or TOML value for an axis (``--batch-sizes 1,8``) means that axis for every engine.
        """
        if "engine_axes" not in changes and self.engine_axes:
            set_axes = [a for a in ENGINE_AXES if a in changes]
            changes["engine_axes"] = {
                e: {a: v for a, v in ax.items() if a not in set_axes} for e, ax in self.engine_axes.items()
            }
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able dict (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: SweepSpec | None = None) -> SweepSpec:
        """Overlay ``data`` (from TOML or a stored run) on ``base``; unknown keys are an error."""
        base = base or cls()
        names = {f.name: f for f in dataclasses.fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in data.items():
            k = str(key).replace("-", "_")
            if k not in names:
                raise UsageError(f"unknown sweep setting {key!r}", f"use one of: {', '.join(sorted(names))}")
            changes[k] = typed_value(k, value, str(names[k].type), toml_example(k, names[k].default))
        return base.overlay(**changes)


def _positive_ints(name: str, values: tuple[Any, ...], allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise UsageError(
            f"{name} is empty", f"give at least one positive integer, e.g. --{name.replace('_', '-')} 1,8"
        )
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(
                f"{name} has {v!r}, which is not a positive integer", "use positive integers like 1,2,4"
            )


def validate(spec: SweepSpec) -> SweepSpec:
    """Check every field; return ``spec`` unchanged or raise a `UsageError`."""
    from deepgap.measure.engines.catalog import engine_info
    from deepgap.measure.llm_workload import check_workload
    from deepgap.measure.models import resolve_model
    from deepgap.measure.models.inputs import check_seq_lens, check_text_inputs

    if not spec.models:
        raise UsageError("no models given", "pass e.g. --models resnet50 (see `deepgap list models`)")
    for m in spec.models:
        resolve_model(m)
    if not spec.engines:
        raise UsageError("no engines given", "pass e.g. --engines eager (see `deepgap list engines`)")
    for e in spec.engines:
        engine_info(e)
    if not spec.precisions:
        raise UsageError(
            "no precisions given", f"pass e.g. --precisions fp32,fp16 (known: {', '.join(PRECISIONS)})"
        )
    for p in spec.precisions:
        if p not in PRECISIONS:
            raise UsageError(f"unknown precision {p!r}", f"choose from {', '.join(PRECISIONS)}")
    _positive_ints("batch_sizes", spec.batch_sizes)
    _positive_ints("threads", spec.threads, allow_empty=True)
    if not isinstance(spec.cpu_baseline, bool):
        raise UsageError(
            f"cpu_baseline must be true or false, got {spec.cpu_baseline!r}",
            "write cpu_baseline = false (or pass --no-cpu-baseline)",
        )
    if spec.cpu_cores is not None:
        _positive_ints("cpu_cores", (spec.cpu_cores,))
    _positive_ints("seq_lens", spec.seq_lens, allow_empty=True)
    check_seq_lens(spec.models, spec.seq_lens)
    for name, high in (("batch_sizes", MAX_BATCH), ("threads", MAX_THREADS)):
        for v in getattr(spec, name):
            check_range(name, v, 1, high, name.replace("_", "-"), "8", integer=True)
    for mf in spec.memory_formats:
        if mf not in MEMORY_FORMATS:
            raise UsageError(f"unknown memory format {mf!r}", f"choose from {', '.join(MEMORY_FORMATS)}")
    if not spec.memory_formats:
        raise UsageError("no memory formats given", "pass --memory-formats nchw")
    _validate_inputs(spec)
    check_text_inputs(spec.models, spec.seq_lens, spec.inputs, spec.seq_len_dist, spec.workload)
    _validate_engine_axes(spec)
    check_workload(spec)  # before the engine pairs: decode names its own engines and precisions
    check_pairs(spec)
    check_device(spec.device)
    if spec.threads and spec.device.startswith("cuda"):
        raise UsageError("--threads sweeps CPU threads", "drop --threads or use --device cpu")
    for name, flag, low, high, example in INT_LIMITS:
        check_range(name, getattr(spec, name), low, high, flag, example, integer=True)
    if spec.resolution is not None:
        check_range("resolution", spec.resolution, 8, 16384, "resolution", "224", integer=True)
    if spec.accuracy_samples is not None:
        check_range(
            "accuracy_samples", spec.accuracy_samples, 1, 10**9, "accuracy-samples", "500", integer=True
        )
    if spec.target_ci is not None and not (is_real(spec.target_ci) and 0 < spec.target_ci < 1):
        raise UsageError(
            f"target CI must be a fraction in (0, 1), got {spec.target_ci!r}", "pass --target-ci 1%"
        )
    for name, flag, low, high, example, low_open in FLOAT_LIMITS:
        check_range(name, getattr(spec, name), low, high, flag, example, low_open=low_open)
    if spec.weights and not os.path.isfile(spec.weights):
        raise UsageError(
            f"weights file {spec.weights!r} does not exist", "pass the path of a local state-dict file"
        )
    if spec.weights and len(spec.models) > 1:
        raise UsageError(
            "--weights applies to one model, but several are given", "run one model per weights file"
        )
    return _accuracy(spec)


def _accuracy(spec: SweepSpec) -> SweepSpec:
    """Check weights and dataset; the dataset's identity and split go into ``options['dataset']``."""
    from deepgap.measure.accuracy.dataset import check_weights, describe

    if spec.min_accuracy is not None and not (is_real(spec.min_accuracy) and 0 <= spec.min_accuracy <= 1):
        raise UsageError(
            f"min_accuracy must be a fraction in (0, 1] or 0 (off), got {spec.min_accuracy!r}",
            "pass --min-accuracy 99%",
        )
    if spec.weights:
        check_weights(spec.models[0], spec.resolution, spec.weights)
    info = describe(spec)
    stored = (spec.options or {}).get("dataset")
    if isinstance(stored, dict) and info is not None and stored.get("sha") != info["sha"]:
        raise UsageError(
            f"dataset {spec.dataset!r} changed since the run started", "restore it or start a new run"
        )
    options = dict(spec.options or {})
    if spec.min_accuracy is not None:
        options["min_accuracy"] = float(spec.min_accuracy)
    if info is not None:
        options["dataset"] = info
    return spec.replace(options=options) if options != (spec.options or {}) else spec


def _validate_inputs(spec: SweepSpec) -> None:
    """Known input modes; a resident input is already on the device, so there is no copy to time."""
    if not spec.inputs:
        raise UsageError("no inputs given", f"pass e.g. --inputs default (known: {', '.join(INPUT_MODES)})")
    for i in spec.inputs:
        if i not in INPUT_MODES:
            raise UsageError(f"unknown input {i!r}", f"choose from {', '.join(INPUT_MODES)} (--inputs)")
    resident = [i for i in spec.inputs if i == "int8-resident"]
    if resident and spec.include_transfer:
        raise UsageError(
            f"--include-transfer times a host→device copy, but the {resident[0]} input is already on the device",
            "drop --include-transfer, or measure it in a run with --inputs default",
        )


def _validate_engine_axes(spec: SweepSpec) -> None:
    """Per-engine axes: a registered engine, a known axis, valid values (as the sweep's own)."""
    from deepgap.measure.engines.catalog import engine_info

    if not isinstance(spec.engine_axes, dict):
        raise UsageError(
            "engine_axes must be a table of engine → axes",
            "write e.g. engine_axes.quant = {batch_sizes = [1]}",
        )
    for engine, axes in spec.engine_axes.items():
        engine_info(engine)
        if not isinstance(axes, dict):
            raise UsageError(
                f"engine_axes.{engine} must be a table",
                f"write e.g. engine_axes.{engine} = {{batch_sizes = [1]}}",
            )
        for axis, values in axes.items():
            if axis not in ENGINE_AXES:
                raise UsageError(
                    f"engine_axes.{engine} has unknown axis {axis!r}", f"use {', '.join(ENGINE_AXES)}"
                )
            values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
            known = {"precisions": PRECISIONS, "memory_formats": MEMORY_FORMATS}.get(axis)
            if axis == "batch_sizes":
                _positive_ints(f"engine_axes.{engine}.batch_sizes", values)
            elif axis == "models":
                _engine_models(engine, values, spec.models)
            elif not values or any(v not in known for v in values):
                raise UsageError(
                    f"engine_axes.{engine}.{axis} = {list(values)!r} is not valid",
                    f"choose from {', '.join(known)}",
                )


def _engine_models(engine: str, values: tuple, models: tuple) -> None:
    """``engine_axes.<engine>.models``: some of the sweep's own models, at least one."""
    stray = [v for v in values if v not in models]
    if not values or stray:
        raise UsageError(
            f"engine_axes.{engine}.models = {list(values)!r} names {', '.join(map(str, stray)) or 'no model'}"
            f"{' that the sweep does not run' if stray else ''}",
            f"choose from the sweep's models ({', '.join(models)}), or drop engine_axes.{engine}.models",
        )


def parse_percent(text: str) -> float | None:
    """'1%' → 0.01, '0.01' → 0.01, 'off' → None (fixed iteration count)."""
    t = text.strip()
    if t.lower() in ("off", "none"):
        return None
    try:
        return float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise UsageError(f"{text!r} is not a fraction or percentage", "write e.g. 1% or 0.01") from None


def parse_number(text: str, kind: type, flag: str, example: str = "10") -> int | float:
    """``kind(text)`` for the flag ``--flag``; a `UsageError` naming the flag for anything else."""
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(
            f"--{flag} {text!r} is not {'an integer' if kind is int else 'a number'}",
            f"pass e.g. --{flag} {example}",
        ) from None
    if kind is float and not math.isfinite(value):  # no flag means "forever" by inf: an unbounded wait hangs
        raise UsageError(f"--{flag} {text!r} is not a finite number", f"pass e.g. --{flag} {example}")
    return value


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """'1,2,4' → (1, 2, 4); a clear error for anything else (an empty item too: '1,,2')."""
    items = _items(text, name)
    try:
        values = tuple(int(t) for t in items)
    except ValueError:
        raise UsageError(
            f"{name} {text!r} is not a comma-separated list of integers", "write e.g. 1,8,32"
        ) from None
    _positive_ints(name.replace("-", "_"), values)
    return values


def parse_str_list(text: str, name: str = "the list") -> tuple[str, ...]:
    """'a,b' → ('a', 'b'); an empty item ('a,,b', 'a,') is an error, not something to skip."""
    return tuple(_items(text, name))


def _items(text: str, name: str) -> list[str]:
    """The comma-separated items of ``text``: none when all are blank, else an error for a blank one."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        return []
    if not all(items):
        raise UsageError(
            f"{name} {text!r} has an empty item", "remove the extra comma, e.g. write 1,2 not 1,,2"
        )
    return items
