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
from deepgap.measure.llm_workload import KV_CACHES

NAME = "run"
HELP = "measure a sweep (models × engines × precisions × batch sizes) into the store"
ORDER = 1
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("config", "dataset", "weights"), ("report", "store")


def _number(kind: type, flag: str):
    return lambda text: parse_number(text, kind, flag)


def _ints(flag: str):
    return lambda text: parse_int_list(text, flag)


_QUANTIZED = "/".join(quantized_names())
# --flag-name (as flag_name) → (the SweepSpec field it sets, its parser, its help[, metavar]), in the
# order `--help` lists them: what is measured, how each configuration is timed, what the run writes
_GRID_FLAGS = {
    "models": ("models", parse_str_list, "comma-separated, e.g. resnet18,resnet50 (deepgap list models)"),
    "engines": ("engines", parse_str_list, "comma-separated, e.g. eager (deepgap list engines)"),
    "precisions": ("precisions", parse_str_list, f"comma-separated: {','.join(PRECISIONS)}"),
    "batch_sizes": ("batch_sizes", _ints("batch-sizes"), "comma-separated positive integers, e.g. 1,8,32"),
    "memory_formats": ("memory_formats", parse_str_list, "nchw,channels_last"),
    "threads": ("threads", _ints("threads"), "CPU thread counts to sweep, e.g. 1,2,4"),
    "device": ("device", str, "auto | cpu | cuda | cuda:N"),
    "resolution": (
        "resolution",
        _number(int, "resolution"),
        "input height = width (default: the model's, 224)",
    ),
    "seq_lens": (
        "seq_lens",
        _ints("seq-lens"),
        "text models' sequence lengths to sweep, e.g. 128,384 (default 128)",
    ),
    "inputs": (
        "inputs",
        lambda t: parse_str_list(t, "--inputs"),
        f"input modes, each its own rows: {','.join(INPUT_MODES)} (int8 images resident in GPU "
        "memory, MLPerf-like; quant engine | text models' mixed lengths from --seq-len-dist, padding "
        "removed or padded to the batch's longest) (default: default)",
    ),
    "seq_len_dist": (
        "seq_len_dist",
        str,
        "lengths of --inputs packed/padded: fixed:L, uniform:LO:HI or L1:W1,L2:W2 (weighted), each at "
        "most the sequence length",
    ),
    "workload": (
        "workload",
        str,
        "forward (a timed forward pass; default) | decode (a Llama decoder's greedy generation: TTFT, "
        "TPOT, tokens/s, J/token; docs/llm.md)",
    ),
    "input_lens": (
        "input_lens",
        _ints("input-lens"),
        "decode: prompt tokens per sequence, e.g. 128,1024 (default 128)",
    ),
    "output_lens": (
        "output_lens",
        _ints("output-lens"),
        "decode: generated tokens per sequence, e.g. 128 (default 128)",
    ),
    "kv_caches": (
        "kv_caches",
        lambda t: parse_str_list(t, "--kv-caches"),
        f"decode: KV-cache formats, each its own rows: {','.join(KV_CACHES)} (auto: the decoder's own dtype; "
        "fp8: e4m3 codes at scale 1, as vLLM's uncalibrated fp8 cache) (default: auto)",
    ),
}
_PROTOCOL_FLAGS = {
    "warmup": ("warmup", _number(int, "warmup"), "untimed iterations before timing (paper: 20)"),
    "iterations": ("iterations", _number(int, "iterations"), "timed iterations per repeat (paper: 100)"),
    "repeats": ("repeats", _number(int, "repeats"), "repeats per configuration (paper: 3)"),
    "sweeps": ("sweeps", _number(int, "sweeps"), "passes over the whole batch sweep (paper: 10)"),
    "target_ci": (
        "target_ci",
        parse_percent,
        "adaptive: repeat until the median's 95%% CI is within this, e.g. 1%%; off = fixed count",
    ),
    "max_time": ("max_time_s", _number(float, "max-time"), "adaptive: seconds per configuration at most"),
    "min_time": (
        "min_time_s",
        _number(float, "min-time"),
        "minimum seconds of each pipelined window (energy needs ≥ 1 s)",
    ),
    "timeout": (
        "timeout_s",
        _number(float, "timeout"),
        "seconds before a hung configuration is killed (default 900)",
    ),
    "weights": ("weights", str, "local state-dict file instead of random weights (one model)"),
    "seed": ("seed", _number(int, "seed"), "seed of weights and inputs (default 0)"),
    "dataset": (
        "dataset",
        str,
        "labelled images (ImageFolder tree or CSV of path,label): top-1/top-5 per configuration, "
        f"{_QUANTIZED} calibrated on a disjoint split",
        "PATH",
    ),
    "accuracy_samples": (
        "accuracy_samples",
        _number(int, "accuracy-samples"),
        "score N evaluation images of --dataset (default: all)",
        "N",
    ),
    "min_accuracy": (
        "min_accuracy",
        lambda t: _min_accuracy(t),
        f"top-1 relative to fp32 at least this, e.g. 99%% (default: 99%% for {_QUANTIZED}, MLPerf's rule)",
        "PCT",
    ),
}
_OUTPUT_FLAGS = {
    "energy_window": (
        "energy_window_s",
        _number(float, "energy-window"),
        "seconds each pipelined window lasts at least, with an energy counter (default 1)",
    ),
}
_FLAGS = {**_GRID_FLAGS, **_PROTOCOL_FLAGS, **_OUTPUT_FLAGS}


def _min_accuracy(text: str) -> float:
    from deepgap.analysis.accuracy import parse_min_accuracy

    return parse_min_accuracy(text)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    _grid_arguments(p)
    _protocol_arguments(p)
    _output_and_fleet_arguments(p)
    add_session_arguments(p, SessionDefaults.of(SweepSpec, "the preset's; on for the default GPU grid"))


def _add_flags(p: argparse.ArgumentParser, flags: dict[str, tuple]) -> None:
    for name, (_field, _parse, text, *metavar) in flags.items():
        p.add_argument("--" + name.replace("_", "-"), metavar=(metavar or [None])[0], help=text)


def _grid_arguments(p: argparse.ArgumentParser) -> None:
    """What is measured: the grid's axes, its presets and file, the workload and its lengths."""
    p.add_argument(
        "--preset",
        help="paper | gpu | transformers | cpu | quick (default: gpu grid with a GPU, else cpu grid)",
    )
    p.add_argument("--config", metavar="TOML", help="sweep file; flags override it")
    _add_flags(p, _GRID_FLAGS)


def _protocol_arguments(p: argparse.ArgumentParser) -> None:
    """How each configuration is timed and checked: counts, adaptive stopping, weights, accuracy."""
    _add_flags(p, _PROTOCOL_FLAGS)
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
    _add_flags(p, _OUTPUT_FLAGS)
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
        for flag, (field, parse, *_help) in _FLAGS.items()
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


def _check_store_beside(report: str, store: str | None) -> None:
    """A `UsageError` when the store would live in the report's files folder, which the report replaces."""
    import os

    from deepgap.core.errors import UsageError
    from deepgap.report.output_path import files_dir

    folder = os.path.realpath(files_dir(report))
    if store and os.path.realpath(store).startswith(folder + os.sep):
        raise UsageError(
            f"--store {store} is inside {folder}, the folder --report {report} replaces",
            "pass a store path outside it",
        )


def _check_resume(args: argparse.Namespace) -> None:
    """A `UsageError` for a grid or protocol setting beside ``--resume``, which keeps the stored run's own.

    Why: ``run --resume --models tinybert`` resumed the stored tinycnn sweep and dropped ``--models``
    without a word; the user believed the new grid was measured.
    """
    from deepgap.core.errors import UsageError

    given = [
        f"--{flag.replace('_', '-')}"
        for flag in (*_GRID_FLAGS, *_PROTOCOL_FLAGS)
        if getattr(args, flag) is not None
    ]
    given += [f"--{name}" for name in ("preset", "config") if getattr(args, name)]
    if args.resume and given:
        raise UsageError(
            f"--resume continues the stored run with its own settings, but {', '.join(given)} was given too",
            f"drop {', '.join(given)}, or start a new run without --resume",
        )


def main(args: argparse.Namespace) -> int:  # noqa: D103
    _check_resume(args)
    spec = build_spec(args)
    if args.report:  # an unwritable report path must fail before the sweep, not after it
        from deepgap.report.output_path import check_output

        check_output(args.report)
        _check_store_beside(args.report, args.store)
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
    if not args.quiet and not args.json:
        _print_answer(res.store_path, res.run_id)
    return _exit_code(res)


def _exit_code(res) -> int:
    """0 when some configuration was measured; 1, with one line on stderr, when none was (`outcome`)."""
    from deepgap.commands.outcome import measured_or_1

    where = f"`deepgap show {res.store_path} --run {res.run_id}` gives each reason"
    return measured_or_1([r.status.value for r in res.results], "configuration", where)


def _print_answer(store: str, run_id: str) -> None:
    """The run's answer, as ``deepgap recommend STORE --run ID`` prints it: the main command ends on it.

    Why: deepgap answers which device, engine, precision and batch to deploy; a run that ended on "16
    configurations stored" left the user to know the next command. A failure here is one line on stderr:
    the measurements are stored whatever it says.
    """
    import shlex

    from deepgap.commands import recommend

    p = argparse.ArgumentParser(add_help=False)
    recommend.add_arguments(p)
    print(
        f"\nthe answer (deepgap recommend {shlex.quote(store)} --run {run_id}; "
        "--slo-p99 and --max-memory set limits):"
    )
    try:
        recommend.main(p.parse_args([store, "--run", run_id]))
    except Exception as e:  # noqa: BLE001  (the run is stored; only its summary failed)
        print(
            f"deepgap: the answer could not be printed ({type(e).__name__}: {e}); the run is stored",
            file=sys.stderr,
        )


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
