"""``deepgap run``: measure a sweep into the store (presets, TOML, flags; resume)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from deepgap import api
from deepgap.commands.session_flags import SessionDefaults, add_session_arguments, read_session_arguments
from deepgap.core.precision import PRECISIONS, quantized_names
from deepgap.core.records import INPUT_MODES
from deepgap.drive.config import SweepSpec, parse_int_list, parse_number, parse_percent, parse_str_list
from deepgap.drive.presets import decode_defaults, default_spec, load_toml, preset
from deepgap.drive.progress import Progress

NAME = "run"
HELP = "measure a sweep (models × engines × precisions × batch sizes) into the store"
ORDER = 1
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("config", "dataset", "weights"), ("report", "store")


def _number(kind: type, flag: str):
    return lambda text: parse_number(text, kind, flag)


# flag → (SweepSpec field, parser)
_FLAGS = {
    "models": ("models", parse_str_list),
    "engines": ("engines", parse_str_list),
    "precisions": ("precisions", parse_str_list),
    "batch_sizes": ("batch_sizes", lambda t: parse_int_list(t, "batch-sizes")),
    "memory_formats": ("memory_formats", parse_str_list),
    "threads": ("threads", lambda t: parse_int_list(t, "threads")),
    "device": ("device", str),
    "resolution": ("resolution", _number(int, "resolution")),
    "seq_lens": ("seq_lens", lambda t: parse_int_list(t, "seq-lens")),
    "inputs": ("inputs", lambda t: parse_str_list(t, "--inputs")),
    "workload": ("workload", str),
    "input_lens": ("input_lens", lambda t: parse_int_list(t, "input-lens")),
    "output_lens": ("output_lens", lambda t: parse_int_list(t, "output-lens")),
    "warmup": ("warmup", _number(int, "warmup")),
    "iterations": ("iterations", _number(int, "iterations")),
    "repeats": ("repeats", _number(int, "repeats")),
    "sweeps": ("sweeps", _number(int, "sweeps")),
    "target_ci": ("target_ci", parse_percent),
    "max_time": ("max_time_s", _number(float, "max-time")),
    "min_time": ("min_time_s", _number(float, "min-time")),
    "timeout": ("timeout_s", _number(float, "timeout")),
    "weights": ("weights", str),
    "seed": ("seed", _number(int, "seed")),
    "energy_window": ("energy_window_s", _number(float, "energy-window")),
    "dataset": ("dataset", str),
    "accuracy_samples": ("accuracy_samples", _number(int, "accuracy-samples")),
    "min_accuracy": ("min_accuracy", lambda t: _min_accuracy(t)),
}


def _min_accuracy(text: str) -> float:
    from deepgap.analysis.accuracy import parse_min_accuracy

    return parse_min_accuracy(text)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    _grid_arguments(p)
    _protocol_arguments(p)
    _output_and_fleet_arguments(p)
    add_session_arguments(p, SessionDefaults.of(SweepSpec, "the preset's; on for the default GPU grid"))


def _grid_arguments(p: argparse.ArgumentParser) -> None:
    """What is measured: the grid's axes, its presets and file, the workload and its lengths."""
    p.add_argument(
        "--preset",
        help="paper | gpu | transformers | cpu | quick (default: gpu grid with a GPU, else cpu grid)",
    )
    p.add_argument("--config", metavar="TOML", help="sweep file; flags override it")
    p.add_argument("--models", help="comma-separated, e.g. resnet18,resnet50 (deepgap list models)")
    p.add_argument("--engines", help="comma-separated, e.g. eager (deepgap list engines)")
    p.add_argument("--precisions", help=f"comma-separated: {','.join(PRECISIONS)}")
    p.add_argument("--batch-sizes", help="comma-separated positive integers, e.g. 1,8,32")
    p.add_argument("--memory-formats", help="nchw,channels_last")
    p.add_argument("--threads", help="CPU thread counts to sweep, e.g. 1,2,4")
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--resolution", help="input height = width (default: the model's, 224)")
    p.add_argument("--seq-lens", help="text models' sequence lengths to sweep, e.g. 128,384 (default 128)")
    p.add_argument(
        "--inputs",
        help=f"input modes, each its own rows: {','.join(INPUT_MODES)} (int8 images resident in GPU "
        "memory, MLPerf-like; quant engine) (default: default)",
    )
    p.add_argument(
        "--workload",
        help="forward (a timed forward pass; default) | decode (a Llama decoder's greedy generation: TTFT, "
        "TPOT, tokens/s, J/token; docs/llm.md)",
    )
    p.add_argument("--input-lens", help="decode: prompt tokens per sequence, e.g. 128,1024 (default 128)")
    p.add_argument("--output-lens", help="decode: generated tokens per sequence, e.g. 128 (default 128)")


def _protocol_arguments(p: argparse.ArgumentParser) -> None:
    """How each configuration is timed and checked: counts, adaptive stopping, weights, accuracy."""
    p.add_argument("--warmup", help="untimed iterations before timing (paper: 20)")
    p.add_argument("--iterations", help="timed iterations per repeat (paper: 100)")
    p.add_argument("--repeats", help="repeats per configuration (paper: 3)")
    p.add_argument("--sweeps", help="passes over the whole batch sweep (paper: 10)")
    p.add_argument(
        "--target-ci",
        help="adaptive: repeat until the median's 95%% CI is within this, e.g. 1%%; off = fixed count",
    )
    p.add_argument("--max-time", help="adaptive: seconds per configuration at most")
    p.add_argument("--min-time", help="minimum seconds of each pipelined window (energy needs ≥ 1 s)")
    p.add_argument("--timeout", help="seconds before a hung configuration is killed (default 900)")
    p.add_argument("--weights", help="local state-dict file instead of random weights (one model)")
    p.add_argument("--seed", help="seed of weights and inputs (default 0)")
    p.add_argument(
        "--dataset",
        metavar="PATH",
        help="labelled images (ImageFolder tree or CSV of path,label): top-1/top-5 per configuration, "
        f"{'/'.join(quantized_names())} calibrated on a disjoint split",
    )
    p.add_argument(
        "--accuracy-samples", metavar="N", help="score N evaluation images of --dataset (default: all)"
    )
    p.add_argument(
        "--min-accuracy",
        metavar="PCT",
        help=f"top-1 relative to fp32 at least this, e.g. 99%% (default: 99%% for "
        f"{'/'.join(quantized_names())}, MLPerf's rule)",
    )
    p.add_argument(
        "--include-transfer", action="store_true", help="time the host→device copy of pinned inputs"
    )


def _output_and_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """Where the run goes and what it writes: host CPU, energy window, resume, report, JSON, fleets."""
    p.add_argument(
        "--no-cpu-baseline",
        action="store_true",
        help="on a GPU, skip the host-CPU part (~1 min after the GPU's; docs/cpu-baseline.md)",
    )
    p.add_argument(
        "--energy-window",
        help="seconds each pipelined window lasts at least, with an energy counter (default 1)",
    )
    p.add_argument(
        "--resume", nargs="?", const=True, metavar="RUN_ID", help="continue the last unfinished run"
    )
    p.add_argument("--report", metavar="HTML", help="write an HTML report of this run when done")
    p.add_argument("--json", action="store_true", help="one JSON line per finished configuration on stdout")
    p.add_argument("--devices", help="spread the sweep over this host's GPUs: all, or e.g. cuda:0,cuda:1")
    p.add_argument(
        "--every-card",
        action="store_true",
        help="with --devices: measure every configuration on every GPU (the card-to-card spread)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on a Ray cluster: auto, local or HOST:PORT (pip install 'deepgap[ray]')",
    )
    p.add_argument(
        "--where",
        action="append",
        metavar="KEY=VALUE",
        help="with --ray: only matching nodes, e.g. gpu=L4 (repeatable)",
    )


def build_spec(args: argparse.Namespace) -> SweepSpec:
    """Preset, TOML file or the device's default grid, overlaid with flags."""
    base: SweepSpec | None = preset(args.preset) if args.preset else None
    if args.config:
        base = load_toml(args.config, base)
    changes = {
        field: parse(getattr(args, flag))
        for flag, (field, parse) in _FLAGS.items()
        if getattr(args, flag) is not None
    }
    changes.update(read_session_arguments(args).prelude.changes())  # the run session's flags
    if args.include_transfer:
        changes["include_transfer"] = True
    if args.no_cpu_baseline:
        changes["cpu_baseline"] = False
    if base is None:
        device = str(changes.get("device", "auto"))
        has_gpu = device.startswith("cuda") or (device == "auto" and api.gpu_present())
        base = default_spec(has_gpu, os.cpu_count() or 1)
        if changes.get("workload") == "decode":  # the forward grid's engines and axes do not apply
            base = decode_defaults(base, has_gpu)
    spec = base.overlay(**changes)  # an axis given as a flag replaces the preset's per-engine one too
    if args.seq_lens is not None:
        from deepgap.measure.models.inputs import check_seq_lens

        check_seq_lens(spec.models, spec.seq_lens, explicit=True)
    return spec


def main(args: argparse.Namespace) -> int:  # noqa: D103
    spec = build_spec(args)
    if args.report:  # an unwritable report path must fail before the sweep, not after it
        from deepgap.report.page import check_output

        check_output(args.report)
    progress = Progress(enabled=not args.quiet and not args.json)
    if args.devices or args.ray:
        from deepgap.fleet.progress import FleetProgress

        progress = FleetProgress(enabled=not args.quiet and not args.json)
    try:
        res = api.run(
            spec,
            store=args.store,
            resume=args.resume,
            on_event=progress.on_event,
            command=" ".join(["deepgap", *sys.argv[1:]]),
            devices=args.devices,
            ray=args.ray,
            where=args.where,
            every_card=args.every_card,
            log=(lambda m: print(f"deepgap: {m}", file=sys.stderr)) if not args.quiet else (lambda m: None),
        )
    finally:
        progress.close()
    if args.json:
        for r in res.results:
            print(json.dumps(_as_json(r)))
    elif not args.quiet:
        print(f"run {res.run_id}: {len(res.results)} configurations stored in {res.store_path}")
    if args.report:
        from deepgap.commands.report import write_report

        write_report(res.store_path, args.report, run_ids=[res.run_id])
        if not args.quiet:
            print(f"report written to {args.report}")
    return 0


def _as_json(r) -> dict:
    import dataclasses

    from deepgap.core.stats import P99_MIN_N

    d = {"config": dataclasses.asdict(r.spec), "status": r.status.value, "reason": r.reason}
    if r.spec.is_decode:  # a decode row's figures under their own names (TTFT, TPOT, tokens/s, J/token)
        if r.details.decode is not None:
            d["decode"] = r.details.decode.to_json()
        return d
    if r.latency:
        d.update(
            median_s=r.latency.median_s,
            p99_s=r.latency.p99_s,  # kept for scripts; a p99 only where tail_kind is "p99"
            n=r.latency.n,
            tail_s=r.latency.p99_s if r.latency.n >= P99_MIN_N else r.latency.max_s,
            tail_kind="p99" if r.latency.n >= P99_MIN_N else "max",
            throughput_ips=r.throughput_ips,
            throughput_pipelined_ips=r.throughput_pipelined_ips,
        )
    return d
