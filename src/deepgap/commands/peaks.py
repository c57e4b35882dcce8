"""``deepgap peaks``: measure the device's ceilings (matmul per precision, memory bandwidth), stored.

Parsing and printing only: the run is `deepgap.api.peaks` (`deepgap.roofline.peaks_run`), the output
`deepgap.roofline.console`.
"""

from __future__ import annotations

import argparse
import sys

from deepgap.commands.session_flags import (
    DEFAULT_STORE,
    SessionDefaults,
    add_session_arguments,
    read_session_arguments,
)

NAME = "peaks"
HELP = "measure the device's ceilings (matmul TFLOP/s per precision, memory GB/s) beside its spec sheet"
ORDER = 20


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    from deepgap.drive.config import SweepSpec

    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--size", type=int, help="matmul n for n×n×n (default 8192 on GPUs, 2048 on CPUs)")
    p.add_argument("--bandwidth-mib", type=int, help="copy buffer MiB (default 1024 on GPUs, 256 on CPUs)")
    p.add_argument("--only", help="comma-separated subset of fp32,tf32,fp16,bf16,int8,fp8,memory")
    p.add_argument(
        "--repeats", type=int, default=5, help="timed loops per ceiling; the median is kept (default 5)"
    )
    p.add_argument("--no-store", action="store_true", help="print only, store nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_session_arguments(p, SessionDefaults.of(SweepSpec, "off"), warmup=False)  # no model to warm up with


def main(args: argparse.Namespace) -> int:
    """Parse → `deepgap.api.peaks` (the worker measures; a stored run gets its idle baseline) → print.

    The prelude's lines go to stderr unless ``--quiet``.
    """
    from deepgap import api
    from deepgap.roofline.console import console, peaks_json, peaks_table

    session = read_session_arguments(args)
    if args.no_store and session.store != DEFAULT_STORE:  # it was accepted, and the named store got nothing
        from deepgap.core.errors import UsageError

        raise UsageError(
            f"--no-store stores nothing, but --store names {session.store!r}", "drop --no-store or --store"
        )
    run = api.peaks(
        args.device,
        size=args.size,
        bandwidth_mib=args.bandwidth_mib,
        only=args.only,
        repeats=args.repeats,
        store=None if args.no_store else session.store,
        prelude=session.prelude,
        command=" ".join(["deepgap", *sys.argv[1:]]),
        log=(lambda m: None) if session.quiet else (lambda m: print(f"deepgap: {m}", file=sys.stderr)),
    )
    from deepgap.commands.outcome import measured_or_1

    statuses = [p.status for p in run.peaks]
    if args.json:
        print(peaks_json(run))
        return measured_or_1(statuses, "ceiling", "the JSON above gives each reason")
    console().print(peaks_table(run))
    if run.run_id:
        print(f"stored as run {run.run_id} in {run.store_path}")
    return measured_or_1(statuses, "ceiling", "the table above gives each reason")
