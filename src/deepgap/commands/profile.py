"""``deepgap profile``: per-kernel breakdown of an inference pass or training step, with roofline numbers."""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from deepgap.api import DEFAULT_STORE

NAME = "profile"
HELP = "profile inference or a training step per kernel (torch.profiler; ncu with --ncu) into the store"
ORDER = 21


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
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
        "--ncu-launch-count", type=int, default=0, help="profile at most this many kernels (0: all)"
    )
    p.add_argument(
        "--ncu-timeout", type=float, default=300.0, help="seconds per ncu collection (default 300)"
    )
    p.add_argument("--trace-dir", help="keep each Chrome trace (open in Perfetto) and ncu CSV in this folder")
    p.add_argument("--store", default=DEFAULT_STORE, help=f"SQLite store (default {DEFAULT_STORE})")
    p.add_argument("--top", type=int, default=8, help="kernels to print per profile (default 8)")
    p.add_argument(
        "--idle-time",
        type=float,
        default=2.0,
        help="seconds of idle-baseline power at run start (default 2; 0 = none)",
    )
    p.add_argument(
        "--thermal-warmup",
        action="store_true",
        help="load the device until its temperature is steady before profiling",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary table")


def _validate(args: argparse.Namespace):
    from deepgap.api import resolve_device
    from deepgap.core.errors import UsageError
    from deepgap.core.precision import FLOAT_PRECISIONS
    from deepgap.drive.config import parse_int_list, parse_str_list
    from deepgap.measure.models.registry import resolve_model
    from deepgap.roofline.profile import MODES
    from deepgap.store import check_path

    models = parse_str_list(args.models)
    for m in models:
        resolve_model(m)
    precs = parse_str_list(args.precisions)
    bad = [p for p in precs if p not in FLOAT_PRECISIONS]
    if bad or not precs:
        raise UsageError(
            f"--precision {args.precisions!r}: profile runs PyTorch eager only",
            f"choose from {','.join(FLOAT_PRECISIONS)}",
        )
    modes = parse_str_list(args.mode)
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(
            f"--mode {args.mode!r} is not infer, train or infer,train", "pass --mode infer or --mode train"
        )
    batches = parse_int_list(args.batch_sizes, "batch-size")
    for flag, v, low in (
        ("warmup", args.warmup, 0),
        ("steps", args.steps, 1),
        ("profiled-steps", args.profiled_steps, 1),
        ("ncu-launch-count", args.ncu_launch_count, 0),
        ("top", args.top, 0),
    ):
        if v < low:
            raise UsageError(f"--{flag} must be at least {low}, not {v}", f"pass e.g. --{flag} {max(low, 1)}")
    if args.idle_time < 0:
        raise UsageError(f"--idle-time must be 0 or more, not {args.idle_time}", "pass e.g. --idle-time 2")
    if args.resolution is not None and args.resolution < 8:
        raise UsageError(f"--resolution {args.resolution} is too small", "pass e.g. --resolution 224")
    check_path(args.store)
    return resolve_device(args.device), models, precs, modes, batches


def _busy(res) -> str:
    b = res.details.busy_fraction
    return f"; kernels busy {100 * b:.0f}% of the step" if b is not None else ""


def _print_profile(console, res, top: int) -> None:
    from rich.table import Table

    s = res.spec
    if res.status != "ok":
        console.print(f"[yellow]{s.label()}: {res.status}: {res.reason}[/yellow]")
        return
    console.print(
        f"[bold]{s.label()}[/bold] on {s.device}: {res.step_time_median_s * 1e3:.2f} ms/step, "
        f"{res.throughput_ips:,.0f} img/s, {res.flops_per_step / 1e9:,.1f} GFLOP/step → "
        f"{res.achieved_tflops:.3g} TFLOP/s" + _busy(res)
    )
    t = Table(
        "cluster", "kernels", "launches", "ms/step", "time %", "GFLOP", "MB", "FLOP/B", "TFLOP/s", "GB/s"
    )
    for _, c in res.clusters.iterrows():

        def f(v, fmt):
            return "" if v != v else format(v, fmt)

        t.add_row(
            c["cluster"],
            str(int(c["kernels"])),
            f(c["launches_per_step"], ",.0f"),
            f(c["time_per_step_s"] * 1e3, ".3f"),
            f(100 * c["time_share"], ".1f"),
            f(c["flops_per_step"] / 1e9, ",.2f"),
            f(c["bytes_per_step"] / 1e6, ",.1f"),
            f(c["intensity_flop_per_byte"], ",.1f"),
            f(c["achieved_tflops"], ".3g"),
            f(c["bandwidth_gb_s"], ",.0f"),
        )
    console.print(t)
    if top and res.kernels is not None and len(res.kernels):
        k = Table("top kernels", "cluster", "launches", "ms/step", title=None)
        for _, r in res.kernels.head(top).iterrows():
            k.add_row(
                r["short_name"][:90],
                r["cluster"],
                f"{r['launches_per_step']:.0f}",
                f"{r['time_per_step_s'] * 1e3:.3f}",
            )
        console.print(k)
    if res.ncu:
        n = res.ncu
        if n.get("status") == "ok":
            sm = n.get("summary", {})
            console.print(
                f"ncu (seed formulas, per step): time {sm.get('time_s', 0) * 1e3:.2f} ms, "
                f"DRAM {sm.get('dram_gb_s', 0):,.1f} GB/s, fp32 CUDA-core {sm.get('gflop_s', 0):,.1f} "
                f"GFLOP/s, intensity {sm.get('intensity_flop_per_byte', 0):.2f} FLOP/B "
                f"({sm.get('launches_per_step', 0):.0f} kernels)"
            )
        else:
            why = str(n.get("reason", ""))
            text = why if why.startswith("unavailable") else f"{n.get('status')}: {why}"
            console.print(f"[yellow]ncu: {text}[/yellow]")


PROFILE_TIMEOUT_S = 1800.0  # one profile (warm-up, timed steps, profiled steps) in the worker


def _profile_one(runner, spec, trace_dir: str | None):
    """One profile in the worker: a lost or failing worker becomes the result's status."""
    from deepgap.drive.runner import WorkerFailed, WorkerLost, needs_restart
    from deepgap.roofline.profile import ProfileResult

    try:
        res = runner.call("profile", (spec, trace_dir), PROFILE_TIMEOUT_S)
    except (WorkerLost, WorkerFailed) as lost:
        res = ProfileResult(spec=spec, status=lost.status.value, reason=lost.reason)
    if needs_restart(res.status, spec.device):
        runner.worker.stop()  # the next profile gets a fresh worker
    return res


def _ncu(args: argparse.Namespace, spec, res, ncu_dir: str) -> None:
    if args.ncu and res.status == "ok":
        from deepgap.roofline.ncu import run_ncu

        out = run_ncu(spec, ncu_dir, args.ncu_launch_count, args.ncu_timeout)  # its own child process
        res.ncu = {
            "status": out.status,
            "reason": out.reason,
            "metrics": out.metrics,
            "command": out.command,
            "summary": out.summary,
            "csv": out.csv_path,
        }
        res.ncu_kernels = out.kernels
    elif args.ncu:
        res.ncu = {"status": "skipped", "reason": f"the torch profile {res.status}"}


def main(args: argparse.Namespace) -> int:
    """Parse → session → one ``profile`` request per configuration to the worker → store.

    The worker process measures (the CLI never touches the GPU); the run session measures the idle
    baseline (and the thermal warm-up with ``--thermal-warmup``) first, as for every run.
    """
    from rich.console import Console
    from rich.table import Table

    from deepgap.drive.config import SweepSpec
    from deepgap.drive.plan import expand
    from deepgap.drive.runner import Cascade, SweepRunner
    from deepgap.drive.session import PROFILE, RunSession
    from deepgap.roofline import storage
    from deepgap.roofline.profile import ProfileResult, ProfileSpec

    device, models, precs, modes, batches = _validate(args)
    console = Console(width=None if Console().is_terminal else 160)
    # absolute: the worker's working directory need not be this process's
    trace_dir = os.path.abspath(args.trace_dir) if args.trace_dir else None
    ncu_dir = trace_dir or os.path.join(os.path.dirname(os.path.abspath(args.store)), "ncu")
    sweep = SweepSpec(
        models=tuple(models),
        precisions=tuple(precs),
        batch_sizes=tuple(batches),
        device=device,
        resolution=args.resolution,
        memory_formats=(args.memory_format,),
        idle_s=args.idle_time,
        thermal_warmup=args.thermal_warmup,
    )
    runner = SweepRunner(sweep, device)
    session = RunSession(args.store, PROFILE)
    results = []
    try:
        runner.start()
        env = runner.environment()
        run_id = session.open(
            {
                "models": models,
                "precisions": precs,
                "modes": modes,
                "batch_sizes": list(batches),
                "device": device,
                "resolution": args.resolution,
                "memory_format": args.memory_format,
                "warmup": args.warmup,
                "steps": args.steps,
                "profiled_steps": args.profiled_steps,
                "ncu": args.ncu,
            },
            " ".join(["deepgap", *sys.argv[1:]]),
            env,
        )
        with session:
            log = (lambda m: None) if args.quiet else console.print
            session.prelude(runner, sweep, expand(sweep, device), log)
            cascade = Cascade()  # an OOM or a hang at one batch skips the larger ones
            for model, mode, prec, bs in itertools.product(models, modes, precs, batches):
                spec = ProfileSpec(
                    model,
                    prec,
                    bs,
                    mode,
                    device,
                    args.resolution,
                    args.memory_format,
                    args.warmup,
                    args.steps,
                    args.profiled_steps,
                )
                why = cascade.skip_reason((model, mode, prec))
                if why is not None:
                    res = ProfileResult(spec=spec, status="skipped", reason=why)
                else:
                    res = _profile_one(runner, spec, trace_dir)
                    cascade.note((model, mode, prec), bs, res.status)
                _ncu(args, spec, res, ncu_dir)
                storage.record_profile(session.store, run_id, res)
                results.append(res)
                if not args.quiet:
                    _print_profile(console, res, args.top)
    finally:
        runner.close()
        session.close()
    t = Table(
        "model",
        "mode",
        "precision",
        "batch",
        "ms/step",
        "img/s",
        "GFLOP/step",
        "TFLOP/s",
        "busy %",
        "ncu",
        title=f"profiles on {env.get('device_name')} — run {run_id} in {args.store}",
    )
    for r in results:
        s = r.spec
        if r.status != "ok":
            t.add_row(
                s.model, s.mode, s.precision, str(s.batch_size), r.status, "", "", "", "", r.reason[:40]
            )
            continue
        t.add_row(
            s.model,
            s.mode,
            s.precision,
            str(s.batch_size),
            f"{r.step_time_median_s * 1e3:.2f}",
            f"{r.throughput_ips:,.0f}",
            f"{r.flops_per_step / 1e9:,.1f}",
            f"{r.achieved_tflops:.3g}",
            "" if r.details.busy_fraction is None else f"{100 * r.details.busy_fraction:.0f}",
            (r.ncu or {}).get("status", "not asked"),
        )
    console.print(t)
    return 0
