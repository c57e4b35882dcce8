"""``deepgap profile``: per-kernel breakdown of an inference pass or training step, with roofline numbers.

Parsing and printing only: the run is `deepgap.api.profile` (`deepgap.roofline.profile_run`), the output
`deepgap.roofline.console`.
"""

from __future__ import annotations

import argparse
import sys

from deepgap.commands.session_flags import SessionDefaults, add_session_arguments, read_session_arguments

NAME = "profile"
HELP = "profile inference or a training step per kernel (torch.profiler; ncu with --ncu) into the store"
ORDER = 21


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    from deepgap.drive.config import SweepSpec

    p.add_argument("--model", "--models", dest="models", default="resnet50", help="comma-separated models")
    p.add_argument(
        "--precision", "--precisions", dest="precisions", default="fp32", help="fp32,tf32,fp16,bf16"
    )
    p.add_argument("--batch-size", "--batch-sizes", dest="batch_sizes", default="64", help="comma-separated")
    p.add_argument(
        "--mode", default="infer", help="infer | train | infer,train (train: forward+backward+SGD step)"
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--resolution", type=int, help="input height = width (default: the model's)")
    p.add_argument("--memory-format", default="nchw", choices=("nchw", "channels_last"))
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20; the median is kept)")
    p.add_argument("--profiled-steps", type=int, default=1, help="steps under the profiler / ncu (default 1)")
    p.add_argument(
        "--ncu", action="store_true", help="also collect the paper's Nsight Compute counters (needs ncu)"
    )
    p.add_argument(
        "--ncu-launch-count", type=int, help="with --ncu: profile at most this many kernels (default 0: all)"
    )
    p.add_argument("--ncu-timeout", type=float, help="with --ncu: seconds per ncu collection (default 300)")
    p.add_argument("--trace-dir", help="keep each Chrome trace (open in Perfetto) and ncu CSV in this folder")
    p.add_argument("--top", type=int, default=8, help="kernels to print per profile (default 8)")
    add_session_arguments(p, SessionDefaults.of(SweepSpec, "off"))


def main(args: argparse.Namespace) -> int:
    """Parse → `deepgap.api.profile` (the worker measures, the run session stores) → print.

    ``--quiet`` prints only the summary table: no prelude lines, no table per profile.
    """
    from deepgap import api
    from deepgap.core.errors import UsageError
    from deepgap.core.limits import MAX_DURATION_S
    from deepgap.roofline.console import console, print_profile, profile_summary

    session = read_session_arguments(args)
    if args.top < 0:
        raise UsageError(f"--top must be at least 0, not {args.top}", "pass e.g. --top 1")
    given = [
        f
        for f, v in (("--ncu-launch-count", args.ncu_launch_count), ("--ncu-timeout", args.ncu_timeout))
        if v is not None
    ]
    if given and not args.ncu:  # session 33: they were accepted and did nothing
        raise UsageError(
            f"{' and '.join(given)} only {'applies' if len(given) == 1 else 'apply'} with --ncu, which was not given",
            f"add --ncu or drop {', '.join(given)}",
        )
    timeout = 300.0 if args.ncu_timeout is None else args.ncu_timeout
    if not 1 <= timeout <= MAX_DURATION_S:  # also NaN
        raise UsageError(
            f"--ncu-timeout {args.ncu_timeout:g} is outside 1 to {MAX_DURATION_S:g} s",
            "pass e.g. --ncu-timeout 300",
        )
    out = console()
    run = api.profile(
        args.models,
        precisions=args.precisions,
        modes=args.mode,
        batch_sizes=args.batch_sizes,
        device=args.device,
        resolution=args.resolution,
        memory_format=args.memory_format,
        warmup=args.warmup,
        steps=args.steps,
        profiled_steps=args.profiled_steps,
        ncu=args.ncu,
        ncu_launch_count=args.ncu_launch_count or 0,
        ncu_timeout_s=timeout,
        trace_dir=args.trace_dir,
        store=session.store,
        prelude=session.prelude,
        command=" ".join(["deepgap", *sys.argv[1:]]),
        on_result=(lambda r: None) if session.quiet else (lambda r: print_profile(out, r, args.top)),
        log=(lambda m: None) if session.quiet else out.print,
    )
    out.print(profile_summary(run))
    from deepgap.commands.outcome import measured_or_1

    return measured_or_1([r.status for r in run.results], "profile", "the table above gives each reason")
