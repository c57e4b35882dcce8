"""The run session's flags, declared once for every command that runs something: run, serve, profile, peaks.

Why one group: the prelude's flags (``--idle-time``, ``--thermal-warmup``, ``--thermal-*``, ``--sample-hz``,
``--no-telemetry``) and ``--store``/``--quiet`` were declared in each command, with two types for one flag
(``--idle-time`` a float in profile and peaks, a text parsed later in run and serve) and help that
drifted. `add_session_arguments` declares them, every numeric one as text parsed by
`read_session_arguments` into one typed `SessionArgs` (a bad number: one line naming the flag, exit 2,
nothing written).

What a flag left out means stays each command's: run takes its preset's (the default GPU grid warms up),
serve its `deepgap.serving.run.spec.ServeSpec`'s (a 120-s warm-up bound, on by default on a GPU), profile and
peaks a `deepgap.drive.config.SweepSpec`'s. A command passes those as `SessionDefaults`, which only the help
shows; the values come from the spec itself. Peaks leaves the warm-up flags out (``warmup=False``): it
loads no model to warm the device up with.

This module is not a command (it has no ``NAME``); `deepgap.cli` registers only modules that have one.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from deepgap.api import DEFAULT_STORE
from deepgap.core.errors import UsageError
from deepgap.core.limits import FLOAT_LIMITS
from deepgap.drive.config import parse_number
from deepgap.drive.prelude import PreludeSettings, asks_for_samples

WARMUP_FLAGS = (
    "--thermal-warmup",
    "--no-thermal-warmup",
    "--thermal-window",
    "--thermal-slope",
    "--thermal-timeout",
)
# flag → PreludeSettings field, for the numbers (each parsed as a float, the example from core.limits)
_NUMBERS = {
    "--idle-time": "idle_s",
    "--sample-hz": "sample_hz",
    "--thermal-window": "thermal_window_s",
    "--thermal-slope": "thermal_slope_c_per_min",
    "--thermal-timeout": "thermal_timeout_s",
}
_EXAMPLES = {f"--{flag}": example for _, flag, _, _, example, _ in FLOAT_LIMITS}


@dataclass(frozen=True)
class SessionDefaults:
    """A command's defaults for the session flags, for their help (its spec applies them, not this)."""

    thermal_warmup: str = "off"  # a phrase: "off", "on a GPU" …
    idle_s: float = 2.0
    sample_hz: float = 10.0
    thermal_window_s: float = 30.0
    thermal_slope_c_per_min: float = 1.0
    thermal_timeout_s: float = 300.0

    @classmethod
    def of(cls, spec_type: type, thermal_warmup: str) -> SessionDefaults:
        """The defaults a spec dataclass (`SweepSpec`, `ServeSpec`) declares, so the help cannot drift."""
        declared = {f.name: f.default for f in dataclasses.fields(spec_type)}
        numbers = {f.name: declared[f.name] for f in dataclasses.fields(cls) if f.name in _NUMBERS.values()}
        return cls(thermal_warmup=thermal_warmup, **numbers)


@dataclass(frozen=True)
class SessionArgs:
    """What the session flags asked: the store, quiet, and the prelude's settings (None: the default)."""

    store: str
    quiet: bool
    prelude: PreludeSettings


def add_session_arguments(
    p: argparse.ArgumentParser, defaults: SessionDefaults = SessionDefaults(), warmup: bool = True
) -> None:
    """Declare the session flags on ``p``: one type and one help per flag in every command.

    ``defaults``: the command's own defaults, shown in the help (`SessionDefaults`); ``warmup=False``
    leaves out the thermal warm-up's flags (`WARMUP_FLAGS`) for a command that cannot warm up (peaks).
    """
    d = defaults
    p.add_argument("--store", default=DEFAULT_STORE, help=f"SQLite store (default {DEFAULT_STORE})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--no-telemetry",
        action="store_true",
        help="no power/energy/temperature/clock sampling: no idle baseline, no thermal warm-up",
    )
    p.add_argument(
        "--idle-time", help=f"seconds of idle-baseline power at run start (default {d.idle_s:g}; 0 = none)"
    )
    p.add_argument("--sample-hz", help=f"telemetry samples per second (default {d.sample_hz:g})")
    if not warmup:
        return
    p.add_argument(
        "--thermal-warmup",
        action="store_true",
        help="load the device until its temperature is steady before measuring "
        f"(default: {d.thermal_warmup})",
    )
    p.add_argument(
        "--no-thermal-warmup", action="store_true", help="no thermal warm-up, even where it is the default"
    )
    p.add_argument(
        "--thermal-window",
        help="steady = temperature slope under the threshold over this many s "
        f"(default {d.thermal_window_s:g})",
    )
    p.add_argument(
        "--thermal-slope",
        help=f"steady-state threshold in °C per minute (default {d.thermal_slope_c_per_min:g})",
    )
    p.add_argument(
        "--thermal-timeout",
        help=f"stop the thermal warm-up after this many s anyway (default {d.thermal_timeout_s:g})",
    )


def read_session_arguments(args: argparse.Namespace) -> SessionArgs:
    """The session flags of ``args`` as `SessionArgs`; a `UsageError` for a bad number or a contradiction."""
    values: dict[str, Any] = {}
    for flag, field in _NUMBERS.items():
        text = getattr(args, flag[2:].replace("-", "_"), None)
        if text is not None:
            values[field] = parse_number(text, float, flag[2:], _EXAMPLES[flag])
    on, off = getattr(args, "thermal_warmup", False), getattr(args, "no_thermal_warmup", False)
    if on and off:
        raise UsageError("--thermal-warmup and --no-thermal-warmup contradict each other", "pass one of them")
    if getattr(args, "no_telemetry", False):  # what needs telemetry, asked for beside no telemetry
        flags = {field: flag for flag, field in _NUMBERS.items()} | {"thermal_warmup": "--thermal-warmup"}
        wanted = [flags[k] for k in asks_for_samples(values | {"thermal_warmup": on})]
        if wanted:
            raise UsageError(
                f"--no-telemetry takes no samples, but {', '.join(wanted)} asks for them",
                f"drop --no-telemetry or {', '.join(wanted)}",
            )
    prelude = PreludeSettings(
        telemetry=False if args.no_telemetry else None,
        thermal_warmup=True if on else (False if off else None),
        **values,
    )
    return SessionArgs(store=args.store, quiet=args.quiet, prelude=prelude)
