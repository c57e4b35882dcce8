"""The range and the type of every sweep setting, checked before anything runs.

Why upper bounds: a number past them is a typo, and is not harmless. A sweep count of 10^12
expands into a plan that never ends; a batch of 10^20 does not fit SQLite's 64-bit integers (the
result was lost and the run left broken for --resume); an infinite timeout overflows the worker's
wait; a sample rate of 1e-300 Hz asks to sleep for 1e300 s. Why types: a TOML value of the wrong
type (``device = 5``, ``models = [1]``) used to fail deep inside the run with a traceback, and
``seed = "x"`` ran the whole sweep into error rows. `deepgap.drive.config` uses these, and so does
`deepgap.serving.run.spec` for serve's own numbers.
"""

from __future__ import annotations

import math
import re
from typing import Any

from deepgap.core.errors import UsageError

# The range of every numeric setting of a sweep (the module docstring says why there are upper bounds).
MAX_BATCH = 1 << 20
MAX_THREADS = 4096
MAX_SEED = 2**63 - 1  # a seed is stored as SQLite's signed 64-bit integer and seeds torch and numpy
_DAY_S = 86_400.0
# a latency bound (an SLO) past a day is a typo: `deepgap.serving.sim.arrivals` and `deepgap.analysis.recommend`
MAX_DURATION_S = _DAY_S
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(device: object) -> None:
    """A `UsageError` unless ``device`` is a name deepgap runs on: auto, cpu, cuda or cuda:N.

    Why one check for every command: run and serve had a copy each, while ``peaks --device tpu`` measured
    nothing, stored a run of "unavailable" ceilings and exited 0.
    """
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise UsageError(f"unknown device {device!r}", "use auto, cpu, cuda or cuda:N")


# (field, flag, minimum, maximum, example)
INT_LIMITS = (
    ("warmup", "warmup", 0, 10**7, "20"),
    ("iterations", "iterations", 1, 10**7, "100"),
    ("repeats", "repeats", 1, 10**5, "3"),
    ("sweeps", "sweeps", 1, 1000, "2"),
    ("seed", "seed", 0, MAX_SEED, "0"),
)
# (field, flag, minimum, maximum, example, minimum excluded)
FLOAT_LIMITS = (
    ("max_time_s", "max-time", 0.0, _DAY_S, "60", True),
    ("timeout_s", "timeout", 0.0, 7 * _DAY_S, "900", True),
    ("min_time_s", "min-time", 0.0, 3600.0, "0", False),
    ("sample_hz", "sample-hz", 0.1, 1000.0, "10", False),
    ("energy_window_s", "energy-window", 0.0, 3600.0, "1", False),
    ("idle_s", "idle-time", 0.0, 3600.0, "2", False),
    ("thermal_window_s", "thermal-window", 0.0, 3600.0, "30", True),
    ("thermal_slope_c_per_min", "thermal-slope", 0.0, 100.0, "1", True),
    ("thermal_timeout_s", "thermal-timeout", 0.0, _DAY_S, "300", True),
)
_WHAT = {"sample_hz": "sample rate (Hz)"}


def is_real(v: Any) -> bool:
    """A finite int or float (not a bool, not nan or inf)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a float (a CSV cell, a label): "1e3", "nan" and "inf" do."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def positive_number(text: Any, name: str, fix: str, what: str = "a positive number") -> float:
    """``text`` as a positive, finite float, else a `UsageError` naming ``name`` (a flag, a list's item).

    Why one reader: "abc", "0", "-1", "nan" and "inf" are one mistake to the user (a rate, a weight, a
    tokens/s target that is no positive number), so they get one message, ``fix`` saying what to pass.
    """
    try:
        value = float(str(text).strip())
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{name} must be {what}, got {text!r}", fix)
    return value


def check_range(
    name: str,
    v: Any,
    low: float,
    high: float,
    flag: str,
    example: str,
    integer: bool = False,
    low_open: bool = False,
) -> None:
    """A `UsageError` unless ``v`` is a finite number (an integer where ``integer``) in [low, high].

    ``name`` is the setting's name in the message, ``flag`` and ``example`` make its fix.
    """
    ok = (isinstance(v, int) and not isinstance(v, bool)) if integer else is_real(v)
    if ok and (low < v if low_open else low <= v) and v <= high:
        return
    what = _WHAT.get(name, name)
    kind = "an integer" if integer else "a finite number"
    lo = f"({_fmt(low)}" if low_open else f"[{_fmt(low)}"
    raise UsageError(
        f"{what} must be {kind} in {lo}, {_fmt(high)}], got {v!r}", f"pass e.g. --{flag} {example}"
    )


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


# What a TOML (or stored) value of each annotated field type must be: a `SweepSpec` field typed `int`
# must not receive "abc", a list of names must not hold 1. A float field takes an integer too.
_KINDS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
_EXAMPLES = {
    "target_ci": "0.01",
    "min_accuracy": "0.99",
    "resolution": "224",
    "weights": '"weights.pt"',
    "dataset": '"images/"',
    "accuracy_samples": "500",
    "threads": "[1, 2]",
    "options": "{}",
    "engine_axes": "{quant = {batch_sizes = [1]}}",
}


def toml_example(key: str, default: Any) -> str:
    """``key = …`` as TOML, from the field's default (what the error's fix shows)."""
    if key in _EXAMPLES:
        return _EXAMPLES[key]
    if isinstance(default, tuple):
        return "[" + ", ".join(toml_example("", v) for v in default) + "]"
    if isinstance(default, bool):
        return str(default).lower()
    return f'"{default}"' if isinstance(default, str) else str(default)


def typed_value(key: str, value: Any, annotation: str, example: str) -> Any:
    """``value`` checked against the field's annotation (a list becomes a tuple), or a `UsageError`."""
    ann = annotation.replace(" ", "")
    optional = ann.endswith("|None")
    ann = ann.removesuffix("|None")
    if value is None and optional:
        return None
    if ann.startswith("dict["):
        if not isinstance(value, dict):
            raise UsageError(
                f"sweep setting {key!r} must be a table, got {value!r}", f"write e.g. {key} = {example}"
            )
        return value
    if ann.startswith("tuple["):
        item = ann[len("tuple[") :].split(",")[0]
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not all(_is(v, item) for v in items):
            raise UsageError(
                f"sweep setting {key!r} must be a list of {_NOUNS[item]}, got {value!r}",
                f"write e.g. {key} = {example}",
            )
        return tuple(items)
    if not _is(value, ann):
        raise UsageError(
            f"sweep setting {key!r} must be {_NOUN[ann]}, got {value!r}", f"write e.g. {key} = {example}"
        )
    return value


_NOUN = {"str": "a text", "int": "an integer", "float": "a number", "bool": "true or false"}
_NOUNS = {"str": "texts", "int": "integers", "float": "numbers", "bool": "booleans"}


def _is(value: Any, kind: str) -> bool:
    """Whether ``value`` is of the TOML kind ``kind`` (a bool is not a number)."""
    return isinstance(value, _KINDS[kind]) and (kind == "bool" or not isinstance(value, bool))
