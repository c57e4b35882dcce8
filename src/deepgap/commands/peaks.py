"""``deepgap peaks``: measure the device's ceilings (matmul per precision, memory bandwidth), stored."""

from __future__ import annotations

import argparse
import json
import sys

from deepgap.api import DEFAULT_STORE

NAME = "peaks"
HELP = "measure the device's ceilings (matmul TFLOP/s per precision, memory GB/s) beside its spec sheet"
ORDER = 20


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--store", default=DEFAULT_STORE, help=f"SQLite store (default {DEFAULT_STORE})")
    p.add_argument("--size", type=int, help="matmul n for n×n×n (default 8192 on GPUs, 2048 on CPUs)")
    p.add_argument("--bandwidth-mib", type=int, help="copy buffer MiB (default 1024 on GPUs, 256 on CPUs)")
    p.add_argument("--only", help="comma-separated subset of fp32,tf32,fp16,bf16,int8,fp8,memory")
    p.add_argument(
        "--repeats", type=int, default=5, help="timed loops per ceiling; the median is kept (default 5)"
    )
    p.add_argument("--no-store", action="store_true", help="print only, store nothing")
    p.add_argument(
        "--idle-time",
        type=float,
        default=2.0,
        help="seconds of idle-baseline power at run start (default 2; 0 = none)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _validate(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    from deepgap.api import resolve_device
    from deepgap.core.errors import UsageError
    from deepgap.roofline.peaks import NAMES
    from deepgap.store import check_path

    names = NAMES
    if args.only:
        names = tuple(n.strip() for n in args.only.split(",") if n.strip())
        bad = [n for n in names if n not in NAMES]
        if bad or not names:
            raise UsageError(
                f"--only {args.only!r} names unknown ceilings {bad}", f"choose from {','.join(NAMES)}"
            )
    for flag, v in (("size", args.size), ("bandwidth-mib", args.bandwidth_mib), ("repeats", args.repeats)):
        if v is not None and v < 1:
            raise UsageError(f"--{flag} must be a positive integer, not {v}", f"pass e.g. --{flag} 4")
    if args.idle_time < 0:
        raise UsageError(f"--idle-time must be 0 or more, not {args.idle_time}", "pass e.g. --idle-time 2")
    if not args.no_store:
        check_path(args.store)
    return resolve_device(args.device), names


PEAKS_TIMEOUT_S = 1800.0  # every ceiling of one device, in the worker


def main(args: argparse.Namespace) -> int:
    """Parse → session → one ``peaks`` request to the worker → store.

    The worker process measures (the CLI never touches the GPU); a stored run measures the idle
    baseline first, as every run does.
    """
    from deepgap.core.errors import UsageError
    from deepgap.drive.config import SweepSpec
    from deepgap.drive.runner import SweepRunner, WorkerFailed, WorkerLost
    from deepgap.drive.session import PEAKS, RunSession
    from deepgap.roofline import storage
    from deepgap.roofline.peaks import PeaksRequest
    from deepgap.roofline.specs import spec_for, spec_peak

    device, names = _validate(args)
    bw = args.bandwidth_mib << 20 if args.bandwidth_mib else None
    sweep = SweepSpec(device=device, idle_s=args.idle_time)
    runner = SweepRunner(sweep, device)
    session = RunSession(args.store, PEAKS)
    run_id = None
    try:
        runner.start()
        env = runner.environment()
        if not args.no_store:
            run_id = session.open(
                {
                    "device": device,
                    "size": args.size,
                    "bandwidth_mib": args.bandwidth_mib,
                    "names": list(names),
                    "repeats": args.repeats,
                },
                " ".join(["deepgap", *sys.argv[1:]]),
                env,
            )
        with session:
            if run_id is not None:  # the idle baseline (no thermal warm-up: peaks has no model to load with)
                session.prelude(runner, sweep, [])
            try:
                req = PeaksRequest(args.size, bw, names, args.repeats)
                peaks = runner.call("peaks", req, PEAKS_TIMEOUT_S)
            except (WorkerLost, WorkerFailed) as lost:
                raise UsageError(
                    f"measuring the ceilings of {device} failed ({lost.status.value}: {lost.reason})",
                    "check the device with `deepgap env`",
                ) from None
            if run_id is not None:
                storage.record_peaks(session.store, run_id, peaks)
    finally:
        runner.close()
        session.close()
    spec = spec_for(env.get("device_name")) if device.startswith("cuda") else None
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": run_id,
                    "device": device,
                    "device_name": env.get("device_name"),
                    "spec": spec,
                    "peaks": [p.to_dict() for p in peaks],
                },
                indent=1,
                default=str,
            )
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(
        "ceiling",
        "measured",
        "unit",
        "spec sheet",
        "% of spec",
        "how / why not",
        title=f"ceilings of {env.get('device_name')} ({device})"
        + (f" — spec row: {spec['gpu']}" if spec else ""),
    )
    for p in peaks:
        s = spec_peak(spec, p.name)
        val = f"{p.value:,.2f}" if p.value is not None else "—"
        pct = f"{100 * p.value / s:.0f}%" if p.value is not None and s else ""
        how = (
            (f"{p.details.get('op', '')} n={p.details['m']}" if "m" in p.details else p.details.get("op", ""))
            if p.status == "ok"
            else p.reason
        )
        t.add_row(p.name, val, p.unit, f"{s:,.1f}" if s else "—", pct, how)
    Console(width=None if Console().is_terminal else 160).print(t)
    if run_id:
        print(f"stored as run {run_id} in {args.store}")
    return 0
