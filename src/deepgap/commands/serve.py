"""``deepgap serve``: single-stream, offline and server scenarios under live (open-loop) traffic."""

from __future__ import annotations

import argparse
import json
import sys

from deepgap.commands.session_flags import SessionDefaults, add_session_arguments, read_session_arguments
from deepgap.drive.config import parse_number

NAME = "serve"
HELP = "serve a model under load: single-stream / offline / server (dynamic batching, capacity at an SLO, tenants)"
ORDER = 5
# the paths it reads and writes: no output may replace an input (cli.check_paths)
READS, WRITES = ("trace", "dataset", "weights"), ("store",)


def add_arguments(p: argparse.ArgumentParser) -> None:  # noqa: D103
    p.add_argument("--model", default="resnet50", help="model to serve (deepgap list models)")
    p.add_argument("--engine", default="eager", help="engine (deepgap list engines)")
    p.add_argument("--precision", default="fp32", help="fp32 | tf32 | fp16 | bf16 | int8 | fp8")
    p.add_argument("--memory-format", default="nchw", help="nchw | channels_last")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--resolution", help="input height = width (default: the model's)")
    p.add_argument(
        "--seq-len-dist",
        help="text models: request lengths, fixed:128, uniform:16:128 or 32:3,64,128:1 (length[:weight],…); "
        "default: fixed at the model's default length",
    )
    p.add_argument(
        "--padding",
        default="longest",
        help="text models: pad a batch to its longest request (longest, default) or group requests into "
        "length buckets, one batch per bucket (buckets:32,64,128)",
    )
    p.add_argument(
        "--input-len-dist",
        help="decoders (llama-*): prompt lengths, as --seq-len-dist: fixed:128, uniform:64:256, 32:3,128 "
        "(default fixed:128)",
    )
    p.add_argument(
        "--output-len-dist",
        help="decoders: output tokens per request, as --input-len-dist (default fixed:128)",
    )
    p.add_argument("--slo-ttft", help="decoders: p99 bound of the time to first token (default 2s, MLPerf's)")
    p.add_argument(
        "--slo-tpot", help="decoders: p99 bound of the time per later output token (default 100ms, MLPerf's)"
    )
    p.add_argument("--scenario", default="server", help="single-stream | server | offline (default server)")
    p.add_argument("--qps", help="server: Poisson arrival rate, queries/s (or a trace's target mean rate)")
    p.add_argument(
        "--find-capacity",
        action="store_true",
        help="server: search the highest rate whose p99 stays within --slo-p99, and the batching policy",
    )
    p.add_argument("--slo-p99", help="p99 latency bound, e.g. 15ms")
    p.add_argument(
        "--max-batch",
        help="dynamic batcher: largest batch (default 8; searched with --find-capacity); a decoder: its slots",
    )
    p.add_argument("--max-delay", help="dynamic batcher: longest wait of the oldest request, e.g. 2ms")
    p.add_argument("--trace", help="server: file of arrival timestamps (s), one per line or a CSV column t_s")
    p.add_argument("--seed", default="0", help="seed of arrivals and inputs (default 0)")
    p.add_argument(
        "--min-queries",
        help="minimum queries per run (defaults: single-stream 1024, server 1000, offline 4096)",
    )
    p.add_argument("--min-duration", help="minimum duration per run, e.g. 5s (defaults: 5 s / 2 s / 1 s)")
    p.add_argument("--max-queries", help="cap on queries per run (default 200000)")
    p.add_argument(
        "--confidence", help="confidence of the p99 verdict (default 0.99, as MLPerf's early stopping)"
    )
    p.add_argument(
        "--batch-sizes", help="batch sizes to prepare and calibrate (default GPU 1..128, CPU 1..8)"
    )
    p.add_argument("--tenants", help="several models at once, one process each: resnet50,resnet18[:QPS],…")
    p.add_argument(
        "--load", help="tenants without a rate run at this fraction of their own capacity (default 0.5)"
    )
    p.add_argument(
        "--verify-policies", help="--find-capacity: best simulated policies measured for real (default 2)"
    )
    p.add_argument(
        "--loadgen",
        action="store_true",
        help="also drive the same server with MLCommons LoadGen (pip install 'deepgap[serving]')",
    )
    p.add_argument(
        "--loadgen-duration",
        help="LoadGen's min duration per run, e.g. 600s (MLPerf's full run; default: the scenario's)",
    )
    p.add_argument("--threads", help="CPU intra-op threads of the worker")
    p.add_argument(
        "--curve-iterations",
        help="timed iterations per batch size when calibrating (default GPU 100, CPU 30)",
    )
    p.add_argument("--timeout", help="seconds before a hung worker is killed (default 900)")
    p.add_argument("--weights", help="local state-dict file instead of random weights")
    p.add_argument(
        "--dataset",
        metavar="PATH",
        help="labelled images (ImageFolder or CSV of path,label): top-1/top-5 of the served engine; "
        "int8/fp8 calibrated on a disjoint split",
    )
    p.add_argument(
        "--accuracy-samples", metavar="N", help="score N evaluation images of --dataset (default: all)"
    )
    p.add_argument("--json", action="store_true", help="the headline numbers as one JSON object on stdout")
    from deepgap.serving.run.spec import ServeSpec

    add_session_arguments(p, SessionDefaults.of(ServeSpec, "on a GPU"))


def _int(text: str | None, flag: str) -> int | None:
    return None if text is None else parse_number(text, int, flag, "8")


def _float(text: str | None, flag: str) -> float | None:
    return None if text is None else parse_number(text, float, flag, "0.5")


def build_spec(args: argparse.Namespace):
    """A `ServeSpec` from the flags (parsing errors are `UsageError`s)."""
    from deepgap.drive.config import parse_int_list
    from deepgap.serving.run.spec import ServeSpec, parse_tenants
    from deepgap.serving.sim.arrivals import parse_duration_s, parse_rate_qps

    kw = dict(
        model=args.model,
        engine=args.engine,
        precision=args.precision,
        memory_format=args.memory_format,
        device=args.device,
        scenario=args.scenario,
        seq_len_dist=args.seq_len_dist,
        padding=args.padding,
        find_capacity=args.find_capacity,
        trace=args.trace,
        loadgen=args.loadgen,
        weights=args.weights,
        dataset=args.dataset,
        accuracy_samples=_int(args.accuracy_samples, "accuracy-samples"),
        resolution=_int(args.resolution, "resolution"),
        seed=_int(args.seed, "seed"),
        qps=parse_rate_qps(args.qps) if args.qps is not None else None,
        slo_s=parse_duration_s(args.slo_p99, "slo-p99") if args.slo_p99 is not None else None,
        input_len_dist=args.input_len_dist,
        output_len_dist=args.output_len_dist,
        slo_ttft_s=parse_duration_s(args.slo_ttft, "slo-ttft") if args.slo_ttft is not None else None,
        slo_tpot_s=parse_duration_s(args.slo_tpot, "slo-tpot") if args.slo_tpot is not None else None,
        max_batch=_int(args.max_batch, "max-batch"),
        max_delay_s=(
            0.0
            if args.max_delay is not None and args.max_delay.strip() in ("0", "0ms", "0s")
            else parse_duration_s(args.max_delay, "max-delay")
            if args.max_delay is not None
            else None
        ),
        min_queries=_int(args.min_queries, "min-queries"),
        min_duration_s=parse_duration_s(args.min_duration, "min-duration") if args.min_duration else None,
        loadgen_duration_s=(
            parse_duration_s(args.loadgen_duration, "loadgen-duration") if args.loadgen_duration else None
        ),
        threads=_int(args.threads, "threads"),
        curve_iterations=_int(args.curve_iterations, "curve-iterations"),
        batch_sizes=parse_int_list(args.batch_sizes, "batch-sizes") if args.batch_sizes else None,
        tenants=parse_tenants(args.tenants) if args.tenants else (),
    )
    for flag, field, conv in (
        ("max-queries", "max_queries", _int),
        ("confidence", "confidence", _float),
        ("load", "load", _float),
        ("verify-policies", "verify_policies", _int),
        ("timeout", "timeout_s", _float),
    ):
        v = conv(getattr(args, field if field != "timeout_s" else "timeout"), flag)
        if v is not None:
            kw[field] = v
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
    try:
        out = run_serve(spec, args.store, say=say, command=" ".join(["deepgap", *sys.argv[1:]]))
    except KeyboardInterrupt:
        print(
            "deepgap: interrupted; the serve run, if it had started, is stored as interrupted "
            "without its levels",
            file=sys.stderr,
        )
        return 130
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
    return 0
