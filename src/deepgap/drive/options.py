"""The sweep file's ``[options]`` table: the keys a user may set, each checked when the file is read.

Why here: each option was read where it is used, deep in an engine's build or the worker, so a key
spelled wrong (``calibraton_images``) or a value of the wrong kind was ignored, or failed only in the one
configuration that used it, after the others had been measured; ``telemetry_backend = "nonsense"`` left
every row without power. A TOML file's options are now checked before anything runs: an unknown key or a
bad value is one line, exit 2. The checks are the users' own (`ort_quant.quant_settings`,
`tensorrt_build.profile_shapes`, …), so the file and the build cannot disagree.

Keys deepgap sets itself (``dataset``, ``min_accuracy``, ``serve``) are not the user's to set here: their
flags (``--dataset``, ``--min-accuracy``) check them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from deepgap.core.errors import UsageError


def _text(key: str) -> Callable[[dict[str, Any]], None]:
    def check(options: dict[str, Any]) -> None:
        v = options[key]
        if not isinstance(v, str) or not v.strip():
            raise UsageError(f"option {key} must be a path, got {v!r}", f'set e.g. {key} = "/data/cache"')

    return check


def _calibration_dir(options: dict[str, Any]) -> None:
    _text("calibration_dir")(options)
    if not os.path.isdir(options["calibration_dir"]):
        raise UsageError(
            f"option calibration_dir {options['calibration_dir']!r} is not a folder",
            "point calibration_dir at a folder of images, or drop it to calibrate on the synthetic set",
        )


def _calibration_images(options: dict[str, Any]) -> None:
    from deepgap.measure.images import options_count

    options_count(options)


def _dataset_workers(options: dict[str, Any]) -> None:
    n = options["dataset_workers"]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 256:
        raise UsageError(
            f"option dataset_workers must be a whole number from 0 to 256, got {n!r}",
            "set e.g. dataset_workers = 4",
        )


def _ort(options: dict[str, Any]) -> None:
    from deepgap.measure.engines.ort_quant import quant_settings

    quant_settings(options)


def _trt_profile(options: dict[str, Any]) -> None:
    from deepgap.measure.engines.tensorrt_build import profile_shapes

    profile_shapes(1, options)


def _trt_workspace(options: dict[str, Any]) -> None:
    from deepgap.measure.engines.tensorrt_build import workspace_bytes

    workspace_bytes(options)


def _telemetry(options: dict[str, Any]) -> None:
    from deepgap.measure.telemetry.fake import backend_names

    v = options["telemetry_backend"]
    known = backend_names()
    if v not in known:
        raise UsageError(f"option telemetry_backend {v!r} is unknown", f"choose one of {', '.join(known)}")


USER_OPTIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "cache_dir": _text("cache_dir"),
    "calibration_dir": _calibration_dir,
    "calibration_images": _calibration_images,
    "dataset_workers": _dataset_workers,
    "ort_calibration_method": _ort,
    "telemetry_backend": _telemetry,
    "trt_profile": _trt_profile,
    "trt_profile_batches": _trt_profile,
    "trt_workspace_gib": _trt_workspace,
}


def check_user_options(options: Any, where: str) -> None:
    """Raise a `UsageError` for an ``[options]`` table that is not a table, names an unknown key or a bad value."""
    if not isinstance(options, dict):
        raise UsageError(
            f"{where}: options must be a table, got {options!r}",
            "write [options] on a line of its own, then key = value",
        )
    for key in options:
        if key not in USER_OPTIONS:
            raise UsageError(f"{where}: unknown option {key!r}", f"use one of: {', '.join(USER_OPTIONS)}")
    for key in options:
        try:
            USER_OPTIONS[key](options)
        except UsageError as exc:  # the build's own message, with the file it came from
            raise UsageError(f"{where}: {exc.problem}", exc.fix) from None
