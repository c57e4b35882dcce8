"""``deepgap serve``: single-stream, offline and server scenarios under live (open-loop) traffic."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepgap.commands.session_flags import SessionDefaults, add_session_arguments, read_session_arguments
from deepgap.drive.config import parse_int_list, parse_number
from deepgap.serving.run.spec import ServeSpec, parse_tenants
from deepgap.serving.sim.arrivals import parse_duration_s, parse_rate_qps

NAME = "serve"
HELP = "serve a model under load: single-stream / offline / server (dynamic batching, capacity at an SLO, tenants)"
ORDER = 5
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("trace", "dataset", "weights"), ("store",)


def _int(text: str, flag: str) -> int:
    return parse_number(text, int, flag, "8")


def _float(text: str, flag: str) -> float:
    return parse_number(text, float, flag, "0.5")


def _duration_or_unset(text: str, flag: str) -> float | None:
    """A duration; an empty value means the default (None), as a flag left out."""
    return parse_duration_s(text, flag, None) if text else None  # the spec's ranges say each flag's bound


def _delay(text: str, flag: str) -> float:
    """The batcher's longest wait: 0 (no waiting) is allowed here, unlike any other duration."""
    return 0.0 if text.strip() in ("0", "0ms", "0s") else parse_duration_s(text, flag, None)


@dataclass(frozen=True)
class _Flag:
    """One flag: the `ServeSpec` field it sets (None: not the spec's), how its text is read, its help."""

    field: str | None
    help: str
    # (text, the flag's name) → value, the name for its messages; None: the text (or the switch) as given
    parse: Callable[[str, str], Any] | None = None
    default: str | None = None
    switch: bool = False  # a store_true flag
    metavar: str | None = None


# --flag-name (as flag_name) → its `_Flag`, in the order `--help` lists them: what is served, a text
# model's and a decoder's requests, the scenario and its load, the batcher, run lengths, tenants, LoadGen,
# the worker, accuracy. One table declares each flag and reads it, so the two cannot drift apart.
_FLAGS = {
    "model": _Flag("model", "model to serve (deepgap list models)", default="resnet50"),
    "engine": _Flag("engine", "engine (deepgap list engines)", default="eager"),
    "precision": _Flag("precision", "fp32 | tf32 | fp16 | bf16 | int8 | fp8", default="fp32"),
    "memory_format": _Flag("memory_format", "nchw | channels_last", default="nchw"),
    "device": _Flag("device", "auto | cpu | cuda | cuda:N", default="auto"),
    "resolution": _Flag("resolution", "input height = width (default: the model's)", _int),
    "seq_len_dist": _Flag(
        "seq_len_dist",
        "text models: request lengths, fixed:128, uniform:16:128 or 32:3,64,128:1 (length[:weight],…); "
        "default: fixed at the model's default length",
    ),
    "padding": _Flag(
        "padding",
        "text models: pad a batch to its longest request (longest, default), group requests into "
        "length buckets, one batch per bucket (buckets:32,64,128), or remove the padding (packed: the "
        "batch's requests end to end, MLPerf BERT's condition)",
        default="longest",
    ),
    "input_len_dist": _Flag(
        "input_len_dist",
        "decoders (llama-*): prompt lengths, as --seq-len-dist: fixed:128, uniform:64:256, 32:3,128 "
        "(default fixed:128)",
    ),
    "output_len_dist": _Flag(
        "output_len_dist", "decoders: output tokens per request, as --input-len-dist (default fixed:128)"
    ),
    "kv_cache": _Flag(
        "kv_cache",
        "decoders: the KV cache, auto (the decoder's own dtype) | fp8 (e4m3 codes at scale 1, as vLLM's "
        "uncalibrated fp8 cache); one per run (default auto)",
        default="auto",
    ),
    "slo_ttft": _Flag(
        "slo_ttft_s",
        "decoders: p99 bound of the time to first token (default 2s, MLPerf's)",
        parse_duration_s,
    ),
    "slo_tpot": _Flag(
        "slo_tpot_s",
        "decoders: p99 bound of the time per later output token (default 100ms, MLPerf's)",
        parse_duration_s,
    ),
    "scenario": _Flag("scenario", "single-stream | server | offline (default server)", default="server"),
    "qps": _Flag(
        "qps", "server: Poisson arrival rate, queries/s (or a trace's target mean rate)", parse_rate_qps
    ),
    "find_capacity": _Flag(
        "find_capacity",
        "server: search the highest rate whose p99 stays within --slo-p99, and the batching policy",
        switch=True,
    ),
    "slo_p99": _Flag("slo_s", "p99 latency bound, e.g. 15ms", parse_duration_s),
    "max_batch": _Flag(
        "max_batch",
        "dynamic batcher: largest batch (default 8; searched with --find-capacity); a decoder: its slots",
        _int,
    ),
    "max_delay": _Flag(
        "max_delay_s", "dynamic batcher: longest wait of the oldest request, e.g. 2ms", _delay
    ),
    "trace": _Flag("trace", "server: file of arrival timestamps (s), one per line or a CSV column t_s"),
    "seed": _Flag("seed", "seed of arrivals and inputs (default 0)", _int, default="0"),
    "min_queries": _Flag(
        "min_queries",
        "minimum queries per run (defaults: single-stream 1024, server 1000, offline 4096)",
        _int,
    ),
    "min_duration": _Flag(
        "min_duration_s",
        "minimum duration per run, e.g. 5s (defaults: 5 s / 2 s / 1 s)",
        _duration_or_unset,
    ),
    "max_queries": _Flag(
        "max_queries",
        "cap on queries per level, over the minimums (default 200000; LoadGen's runs keep LoadGen's counts)",
        _int,
    ),
    "confidence": _Flag(
        "confidence",
        "confidence of the p99 verdict (default 0.99, as MLPerf's early stopping)",
        _float,
    ),
    "batch_sizes": _Flag(
        "batch_sizes",
        "batch sizes to prepare and calibrate (default GPU 1..128, CPU 1..8)",
        lambda text, flag: parse_int_list(text, flag) if text else None,
    ),
    "tenants": _Flag(
        "tenants",
        "several models at once, one process each: resnet50,resnet18[:QPS],…",
        lambda text, _: parse_tenants(text) if text else (),
    ),
    "load": _Flag(
        "load",
        "tenants without a rate run at this fraction of their own capacity (default 0.5)",
        _float,
    ),
    "verify_policies": _Flag(
        "verify_policies",
        "--find-capacity: best simulated policies measured for real (default 2)",
        _int,
    ),
    "capacity_tol": _Flag(
        "rel_tol",
        "--find-capacity: stop when the lowest failing rate is within this fraction of the highest passing "
        "one (default 0.03; 0.01: a tighter capacity, more probes)",
        _float,
    ),
    "loadgen": _Flag(
        "loadgen",
        "also drive the same server with MLCommons LoadGen (pip install 'deepgap[serving]')",
        switch=True,
    ),
    "loadgen_duration": _Flag(
        "loadgen_duration_s",
        "LoadGen's min duration per run, e.g. 600s (MLPerf's full run; default: the scenario's)",
        _duration_or_unset,
    ),
    "threads": _Flag("threads", "CPU intra-op threads of the worker", _int),
    "curve_iterations": _Flag(
        "curve_iterations",
        "timed iterations per batch size when calibrating (default GPU 100, CPU 30)",
        _int,
    ),
    "timeout": _Flag("timeout_s", "seconds before a hung worker is killed (default 900)", _float),
    "weights": _Flag("weights", "local state-dict file instead of random weights"),
    "dataset": _Flag(
        "dataset",
        "labelled images (ImageFolder or CSV of path,label): top-1/top-5 of the served engine; "
        "int8/fp8 calibrated on a disjoint split",
        metavar="PATH",
    ),
    "accuracy_samples": _Flag(
        "accuracy_samples",
        "score N evaluation images of --dataset (default: all)",
        _int,
        metavar="N",
    ),
    "json": _Flag(None, "the headline numbers as one JSON object on stdout", switch=True),
}


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    for name, flag in _FLAGS.items():
        how = {"action": "store_true"} if flag.switch else {"default": flag.default, "metavar": flag.metavar}
        p.add_argument("--" + name.replace("_", "-"), help=flag.help, **how)
    add_session_arguments(p, SessionDefaults.of(ServeSpec, "on a GPU"))


def build_spec(args: argparse.Namespace) -> ServeSpec:
    """A `ServeSpec` from the flags (parsing errors are `UsageError`s); a flag left out: the spec's default."""
    kw: dict[str, Any] = {}
    for name, flag in _FLAGS.items():
        value = getattr(args, name)
        if flag.field is not None and value is not None:
            kw[flag.field] = flag.parse(value, name.replace("_", "-")) if flag.parse else value
    prelude = read_session_arguments(args).prelude  # the run session's flags, as deepgap run's
    kw.update(prelude.changes())
    # a GPU serves at steady temperature only after a warm-up: on by default there (`_on_gpu`)
    kw["thermal_warmup"] = (
        prelude.thermal_warmup if prelude.thermal_warmup is not None else _on_gpu(args.device)
    )
    return ServeSpec(**kw)


def _on_gpu(device: str) -> bool:
    """Whether the served device is a GPU (``auto``: whether torch sees one; no CUDA context is made).

    Why: a GPU serves at steady temperature only after a warm-up, so serve warms up there by default,
    as the default sweep does; a CPU has no such prelude.
    """
    from deepgap.drive.session import gpu_present

    return device.startswith("cuda") or (device == "auto" and gpu_present())


def main(args: argparse.Namespace) -> int:  # noqa: D103
    from deepgap.serving.run.serve_run import run_serve

    spec = build_spec(args)
    say = (lambda m: None) if args.quiet or args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    # a stop (Ctrl-C, SIGTERM) is the CLI's: the levels finished before it are stored (`serve_run.steps`)
    out = run_serve(spec, args.store, say=say, command=" ".join(["deepgap", *sys.argv[1:]]))
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": out.run_id,
                    "store": out.store_path,
                    "status": out.status,
                    "reason": out.reason,
                    **out.summary,
                },
                default=str,
            )
        )
    elif not args.quiet:
        for line in out.lines:
            print(line)
        print(f"run {out.run_id} stored in {out.store_path} (deepgap show {out.store_path})")
    return _exit_code(out)


def _exit_code(out) -> int:
    """0 when the configuration was served; 1, with one line on stderr, when nothing was measured.

    Why: a serve of a configuration that cannot run here (``--engine quant`` on a CPU) stored its
    "skipped" row and exited 0, so a script went on as if it had been measured. The row stays stored.
    """
    if out.status == "ok":
        return 0
    print(
        f"deepgap: nothing was served ({out.status}: {out.reason}); the run is stored as {out.status} in "
        f"{out.store_path}",
        file=sys.stderr,
    )
    return 1
