"""``deepgap monitor``: a live view of a GPU (or the CPU) — like ``nvidia-smi dmon``, with energy.

Why: before and during a benchmark one wants to see what the device is doing (is it idle, hot,
power-capped, shared with another process?) with the same readings and decoding deepgap stores.
The monitor only reads (NVML or the CPU backend); it creates no CUDA context, so it never shows up
as a process on the GPU it watches. ``--device cuda:N`` is NVML's (nvidia-smi's) index N; a UUID
(``GPU-…``) names a device exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

NAME = "monitor"
HELP = "live view of a GPU's power, energy, temperature, clocks, utilization, memory and throttle reasons"
ORDER = 12
RAW_STDOUT = True  # a live display (cursor moves) of this machine's device, no store text: unchanged

_COLS = (
    "time",
    "W",
    "W inst",
    "J",
    "°C",
    "mem °C",
    "SM MHz",
    "mem MHz",
    "util %",
    "mem util %",
    "mem GiB",
    "other procs",
    "clock-event reasons",
)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("--device", default="auto", help="auto | cpu | cuda:N (nvidia-smi index) | GPU-<uuid>")
    p.add_argument("--interval", default="1", help="seconds between samples (default 1)")
    p.add_argument("--count", default="0", help="stop after this many samples (default 0: until Ctrl-C)")
    p.add_argument("--plain", action="store_true", help="one line per sample instead of a live table")
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)  # fake:<scenario> in tests


def _open(device: str, backend: str) -> Any:
    """The backend to watch (raises TelemetryUnavailable)."""
    from deepgap.measure.telemetry.base import TelemetryUnavailable

    if backend != "auto":
        from deepgap.measure.telemetry.measuring import open_backend

        return open_backend(device, backend)
    if device == "cpu":
        from deepgap.measure.telemetry.cpu import CpuBackend

        return CpuBackend()
    from deepgap.core.nvml_access import module
    from deepgap.measure.telemetry.nvml import NvmlBackend

    pynvml, why = module()
    if pynvml is None:
        raise TelemetryUnavailable(why)

    if device == "auto":
        try:
            return NvmlBackend(pynvml, index=0, self_on_device=False)
        except TelemetryUnavailable:
            from deepgap.measure.telemetry.cpu import CpuBackend

            return CpuBackend()
    if device.startswith(("GPU-", "MIG-")):
        return NvmlBackend(pynvml, uuid=device, self_on_device=False)
    index = int(device.split(":")[1]) if ":" in device else 0
    return NvmlBackend(pynvml, index=index, self_on_device=False)


def _fmt(v: Any, spec: str = ".0f") -> str:
    return "–" if v is None else format(v, spec)


def row(sample: Any, energy_j: float | None) -> list[str]:
    """One sample as display cells (``–`` where unavailable)."""
    from deepgap.measure.telemetry.base import decode_reasons

    reasons = decode_reasons(sample.clocks_event_reasons)
    return [
        time.strftime("%H:%M:%S", time.localtime(sample.t_s)),
        _fmt(sample.power_w, ".1f"),
        _fmt(sample.power_instant_w, ".1f"),
        _fmt(energy_j, ".1f"),
        _fmt(sample.temp_c),
        _fmt(sample.mem_temp_c),
        _fmt(sample.sm_clock_mhz),
        _fmt(sample.mem_clock_mhz),
        _fmt(sample.util_pct),
        _fmt(sample.mem_util_pct),
        _fmt(None if sample.mem_used_bytes is None else sample.mem_used_bytes / 2**30, ".2f"),
        _fmt(sample.foreign_procs, "d"),
        ",".join(reasons) if reasons else ("–" if sample.clocks_event_reasons is None else "none"),
    ]


def _parse(text: str, kind: type, flag: str, minimum: float, maximum: float) -> Any:
    """A number from ``minimum`` to ``maximum`` (``nan`` and ``1e300`` seconds are refused, not slept)."""
    from deepgap.core.errors import UsageError

    try:
        v = kind(text)
    except ValueError:
        raise UsageError(f"--{flag} {text!r} is not a number", f"pass e.g. --{flag} 1") from None
    if not minimum <= v <= maximum:  # nan fails both
        raise UsageError(
            f"--{flag} must be from {minimum:g} to {maximum:g}, got {text}", f"pass e.g. --{flag} 1"
        )
    return v


def _device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a UUID; a `UsageError` for anything else (``a:b:c``)."""
    from deepgap.core.errors import UsageError

    if text in ("auto", "cpu", "cuda") or text.startswith(("GPU-", "MIG-")):
        return text
    kind, _, index = text.partition(":")
    if kind == "cuda" and index.isdigit() and int(index) < 1024:
        return text
    raise UsageError(
        f"--device {text!r} is not a device", "pass auto, cpu, cuda:N (nvidia-smi index) or GPU-<uuid>"
    )


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.measure.telemetry.base import TelemetryUnavailable, counter_delta

    interval = _parse(args.interval, float, "interval", 0.01, 86400)
    count = _parse(args.count, int, "count", 0, 10**9)
    try:
        backend = _open(_device(args.device), args.backend)
    except TelemetryUnavailable as exc:
        print(f"deepgap monitor: {exc}", file=sys.stderr)
        return 1
    settings = backend.settings()
    title = " ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
    plain = args.plain or not sys.stdout.isatty()
    rows: list[list[str]] = []
    e_start = e_prev = None
    total_j = 0.0
    live = None
    stopped: KeyboardInterrupt | None = None
    try:
        if plain:
            print(f"# {backend.name}: {title}")
            print("# " + " | ".join(_COLS))
        else:
            from rich.live import Live

            live = Live(_table(title, rows), refresh_per_second=4, transient=False)
            live.start()
        n = 0
        while count == 0 or n < count:
            s = backend.read()
            if s.energy_j is not None:  # energy since the monitor started, wrap/reset aware
                if e_prev is not None:
                    d, _ = counter_delta(e_prev, s.energy_j, backend.energy_counter_range_j)
                    total_j += d or 0.0
                e_prev = s.energy_j
                e_start = 0.0 if e_start is None else e_start
            cells = row(s, total_j if e_start is not None else None)
            if plain:
                print("  ".join(cells), flush=True)
            else:
                rows.append(cells)
                del rows[:-20]
                live.update(_table(title, rows))
            n += 1
            if count == 0 or n < count:
                time.sleep(interval)
    except KeyboardInterrupt as exc:
        # Ctrl-C is how an open-ended monitor (--count 0) ends: success. A stop before --count samples,
        # or by SIGTERM/SIGHUP (`cli.Terminated`), is the CLI's 128 + the signal, after the cleanup below.
        if count or getattr(exc, "exit_code", 130) != 130:
            stopped = exc
    finally:
        if live is not None:
            live.stop()
        backend.close()
    for k, why in sorted(backend.unavailable.items()):
        if not k.startswith("setting:"):
            print(f"# {k}: {why}", file=sys.stderr)
    if stopped is not None:
        raise stopped
    return 0


def _table(title: str, rows: list[list[str]]) -> Any:
    from rich.table import Table

    t = Table(*_COLS, title=title, title_justify="left")
    for r in rows:
        t.add_row(*r)
    return t
