"""What ``deepgap serve`` runs: one typed, validated specification (bad input fails before anything runs).

Scenarios follow MLPerf LoadGen's: ``single-stream`` (one query at a time at batch 1; the p90 is
MLPerf's metric), ``offline`` (every sample available at once; throughput at the best batch size)
and ``server`` (open-loop arrivals at a rate, dynamic batching, a p99 latency bound).
Per-run minimums follow LoadGen's rule (both a query count and a duration must be reached) with
defaults sized for a benchmark session rather than LoadGen's 10-minute submission runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.limits import MAX_BATCH, MAX_SEED, MAX_THREADS, check_device, check_range

SCENARIOS = ("single-stream", "server", "offline")
# scenario → (min queries, min duration s); LoadGen's submission defaults are 1024/270336/24576 and 600 s.
MINIMUMS = {"single-stream": (1024, 5.0), "server": (1000, 2.0), "offline": (4096, 1.0)}
GPU_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
CPU_BATCHES = (1, 2, 4, 8)
DEFAULT_POLICY = (8, 0.002)  # max batch, max delay (s) when neither is given nor searched


@dataclass(frozen=True)
class ServeSpec:
    """One ``deepgap serve`` invocation (a single model, or several ``tenants``)."""

    model: str = "resnet50"
    engine: str = "eager"
    precision: str = "fp32"
    memory_format: str = "nchw"
    device: str = "auto"
    resolution: int | None = None
    # A text model's requests (`deepgap.serving.sim.seqlen`): their lengths (None: fixed at the model's
    # default) and how a batch is padded (``longest``, ``buckets:32,64,128`` or ``packed``: not at all)
    seq_len_dist: str | None = None
    padding: str = "longest"
    # A decoder's requests and bounds (`deepgap.serving.run.llm_spec`): prompt and output lengths (None:
    # fixed at 128), TTFT and TPOT bounds (None: MLPerf's 2 s and 100 ms)
    input_len_dist: str | None = None
    output_len_dist: str | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    # A decoder's KV cache (`deepgap.measure.llm_workload.KV_CACHES`): "auto", the decoder's own dtype, or
    # "fp8", e4m3 codes at scale 1 (the sweep's ``--kv-caches``; one value, as one engine and precision)
    kv_cache: str = "auto"
    scenario: str = "server"
    qps: float | None = None
    find_capacity: bool = False
    slo_s: float | None = None
    max_batch: int | None = None
    max_delay_s: float | None = None
    trace: str | None = None
    seed: int = 0
    min_queries: int | None = None
    min_duration_s: float | None = None
    max_queries: int = 200_000
    confidence: float = 0.99
    batch_sizes: tuple[int, ...] | None = None
    tenants: tuple[tuple[str, float | None], ...] = ()
    load: float = 0.5
    verify_policies: int = 2
    loadgen: bool = False
    loadgen_duration_s: float | None = None  # LoadGen's min duration per run (default: the scenario's)
    threads: int | None = None
    curve_iterations: int | None = None
    timeout_s: float = 900.0
    weights: str | None = None
    rel_tol: float = 0.03
    dataset: str | None = (
        None  # accuracy mode (deepgap.measure.accuracy): score the served engine, calibrate on it
    )
    accuracy_samples: int | None = None
    # The run-level prelude, as ``deepgap run``'s (`deepgap.drive.prelude`): same flags and defaults.
    telemetry: bool = True  # False: no idle baseline and no thermal warm-up
    idle_s: float = 2.0  # idle-baseline power measured this long before the worker builds anything
    thermal_warmup: bool = False  # load the device until steady before calibrating (the CLI: on a GPU)
    thermal_window_s: float = 30.0
    thermal_slope_c_per_min: float = 1.0
    thermal_timeout_s: float = 120.0  # the default sweep's bound
    sample_hz: float = 10.0  # telemetry samples per second during the idle baseline and the warm-up
    telemetry_backend: str = "auto"  # auto (NVML on cuda, CPU backend on cpu) | fake:<scenario> (tests)

    def replace(self, **changes: Any) -> ServeSpec:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def minimums(self) -> tuple[int, float]:
        """(min queries, min duration s) of this scenario, flags overriding the defaults."""
        q, d = MINIMUMS[self.scenario]
        return (
            self.min_queries if self.min_queries is not None else q,
            self.min_duration_s if self.min_duration_s is not None else d,
        )

    def buckets(self, device: str) -> tuple[int, ...]:
        """Batch sizes prepared and calibrated: the flag, or the device's default capped at ``max_batch``."""
        if self.batch_sizes:
            return tuple(sorted(set(self.batch_sizes)))
        base = GPU_BATCHES if device.startswith("cuda") else CPU_BATCHES
        if device.startswith("cuda") and _decoder(self):  # a decoder's slots (`llm_spec.decoder_slots`)
            from deepgap.serving.run.llm_spec import decoder_slots

            base = decoder_slots(self)
        if self.max_batch is None:
            return base
        return tuple(sorted({b for b in base if b < self.max_batch} | {self.max_batch}))

    def settings(self) -> dict[str, Any]:
        """JSON-able dict, stored with the run."""
        d = dataclasses.asdict(self)
        d["tenants"] = [list(t) for t in self.tenants]
        return d


def parse_tenants(text: str) -> tuple[tuple[str, float | None], ...]:
    """'resnet50,resnet18:400' → (('resnet50', None), ('resnet18', 400.0))."""
    from deepgap.serving.sim.arrivals import parse_rate_qps

    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, _, rate = item.partition(":") if not item.startswith("timm:") else (item, "", "")
        rate_qps = (
            parse_rate_qps(rate, "tenants rate", "--tenants resnet50:200,resnet18:400") if rate else None
        )
        out.append((name.strip(), rate_qps))
    if len(out) < 2:
        raise UsageError(
            f"--tenants {text!r} names {len(out)} model(s)", "name at least two, e.g. resnet50,resnet18"
        )
    return tuple(out)


# Upper bounds of serve's numbers (as deepgap run's, `deepgap.drive.config`): past them a number is a typo
# that hangs (10^12 queries, a rate of 1e-300 q/s), overflows a wait (a timeout of 1e300 s) or does
# not fit SQLite's 64-bit integers (a seed of 10^23). (field, flag, minimum, maximum, example)
_INT_LIMITS = (
    ("seed", "seed", 0, MAX_SEED, "0"),
    ("max_batch", "max-batch", 1, MAX_BATCH, "8"),
    ("min_queries", "min-queries", 1, 10**7, "1000"),
    ("max_queries", "max-queries", 1, 10**7, "200000"),
    ("curve_iterations", "curve-iterations", 1, 10**6, "30"),
    ("threads", "threads", 1, MAX_THREADS, "4"),
    ("verify_policies", "verify-policies", 1, 100, "2"),
    ("resolution", "resolution", 8, 16384, "224"),
    ("accuracy_samples", "accuracy-samples", 1, 10**9, "500"),
)
_FLOAT_LIMITS = (
    ("qps", "qps", 0.01, 1e6, "200"),
    ("slo_s", "slo-p99", 1e-6, 3600.0, "15ms"),
    ("slo_ttft_s", "slo-ttft", 1e-6, 3600.0, "2s"),
    ("slo_tpot_s", "slo-tpot", 1e-6, 3600.0, "100ms"),
    ("min_duration_s", "min-duration", 1e-3, 86_400.0, "5s"),
    ("loadgen_duration_s", "loadgen-duration", 1e-3, 86_400.0, "600s"),  # 1e30 s overflowed a wait
    ("max_delay_s", "max-delay", 0.0, 60.0, "2ms"),
    ("rel_tol", "capacity-tol", 1e-3, 0.5, "0.01"),  # 0: a search that never ends
    ("timeout_s", "timeout", 1e-3, 7 * 86_400.0, "900"),
    ("idle_s", "idle-time", 0.0, 3600.0, "2"),
    ("thermal_window_s", "thermal-window", 1e-3, 3600.0, "30"),
    ("thermal_slope_c_per_min", "thermal-slope", 1e-3, 100.0, "1"),
    ("thermal_timeout_s", "thermal-timeout", 1e-3, 86_400.0, "120"),
    ("sample_hz", "sample-hz", 0.1, 1000.0, "10"),
)


def _check_ranges(spec: ServeSpec) -> None:
    """Every number of ``spec`` finite and within its bounds (a `UsageError` naming the flag)."""
    for name, flag, low, high, example in _INT_LIMITS:
        if getattr(spec, name) is not None:
            check_range(f"--{flag}", getattr(spec, name), low, high, flag, example, integer=True)
    for name, flag, low, high, example in _FLOAT_LIMITS:
        if getattr(spec, name) is not None:
            check_range(f"--{flag}", getattr(spec, name), low, high, flag, example)
    for b in spec.batch_sizes or ():
        check_range("--batch-sizes", b, 1, MAX_BATCH, "batch-sizes", "1,2,4,8", integer=True)
    for _, qps in spec.tenants:
        if qps is not None:
            check_range("a tenant's rate", qps, 0.01, 1e6, "tenants", "resnet50:200,resnet18")


def validate(spec: ServeSpec) -> ServeSpec:
    """Check every field; return ``spec`` or raise a `UsageError` (one line, exit 2)."""
    _check_names(spec)
    _check_numbers(spec)
    _check_combinations(spec)
    from deepgap.measure.accuracy.dataset import serve_options

    serve_options(spec)  # weights that fit, a usable dataset (exit 2 before anything is written)
    return spec


def _check_names(spec: ServeSpec) -> None:
    """The scenario, models, engine, precision, memory format and device are ones deepgap knows."""
    from deepgap.core.precision import PRECISIONS
    from deepgap.drive.config import MEMORY_FORMATS
    from deepgap.measure.engines.catalog import engine_info
    from deepgap.measure.models import resolve_model

    if spec.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {spec.scenario!r}", f"choose one of: {', '.join(SCENARIOS)}")
    _check_ranges(spec)
    from deepgap.serving.run.llm_spec import check_decoder, check_kv_cache, is_decoder, refuse_decoder_flags

    check_kv_cache(spec.kv_cache)  # a known format, whatever the model (a decoder's flag: below)
    served = [name for name, _ in spec.tenants or ((spec.model, None),)]
    if any(is_decoder(name) for name in served):
        check_decoder(spec)  # its lengths, bounds, engine and what it does not do yet
    else:
        refuse_decoder_flags(spec)
        if any(resolve_model(name).is_text for name in served):
            check_text(spec)
        elif spec.seq_len_dist is not None or spec.padding != "longest":
            flag = "--seq-len-dist" if spec.seq_len_dist is not None else "--padding"
            raise UsageError(f"{flag} applies to text models, and {spec.model} is not one", f"drop {flag}")
    engine_info(spec.engine)
    if spec.precision not in PRECISIONS:
        raise UsageError(f"unknown precision {spec.precision!r}", f"choose from {', '.join(PRECISIONS)}")
    if spec.memory_format not in MEMORY_FORMATS:
        raise UsageError(
            f"unknown memory format {spec.memory_format!r}", f"choose from {', '.join(MEMORY_FORMATS)}"
        )
    check_device(spec.device)


def check_text(spec: ServeSpec) -> None:
    """What text serving takes; one line and exit 2 otherwise.

    Not yet: several tenants, accuracy mode, an engine other than eager (one prepared instance must take
    every padded shape), decoders.
    """
    from deepgap.measure.models.bert import CONFIGS
    from deepgap.serving.run.text_spec import TEXT_ENGINES, text_load

    if spec.tenants:
        raise UsageError(
            "--tenants does not serve text models yet", "serve the text model alone (--model NAME)"
        )
    if spec.model not in CONFIGS:
        raise UsageError(
            f"deepgap serve serves encoder text models (BERT), and {spec.model} is a decoder",
            f"measure it with `deepgap run --models {spec.model} --workload decode`",
        )
    if spec.engine not in TEXT_ENGINES:
        raise UsageError(
            f"deepgap serve runs text models with the eager engine only, not {spec.engine}",
            "pass --engine eager (fp16/bf16 with --precision)",
        )
    for flag, bad in (
        ("--dataset", spec.dataset),
        ("--resolution", spec.resolution is not None),
        ("--memory-format", spec.memory_format != "nchw"),
    ):
        if bad:
            raise UsageError(
                f"{flag} does not apply to text models in deepgap serve yet", f"drop {flag} for {spec.model}"
            )
    text_load(spec.seq_len_dist, spec.padding, spec.model)


def _check_numbers(spec: ServeSpec) -> None:
    """Every number positive, finite and within its range."""
    for name in ("qps", "slo_s", "min_duration_s", "max_delay_s", "timeout_s"):
        v = getattr(spec, name)
        ok = v is None or (
            isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 or (name == "max_delay_s" and v == 0))
        )
        if not ok:
            flag = name.replace("_s", "").replace("_", "-").replace("slo", "slo-p99")
            raise UsageError(f"--{flag} must be positive, got {v!r}", f"pass a positive --{flag}")
    for name in ("max_batch", "min_queries", "curve_iterations", "threads"):
        v = getattr(spec, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(
                f"--{name.replace('_', '-')} must be a positive integer, got {v!r}",
                f"pass e.g. --{name.replace('_', '-')} 8",
            )
    if spec.batch_sizes is not None and any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in spec.batch_sizes
    ):
        raise UsageError(f"--batch-sizes {spec.batch_sizes!r} must be positive integers", "pass e.g. 1,2,4,8")
    if spec.batch_sizes and spec.max_batch and spec.max_batch > max(spec.batch_sizes):
        raise UsageError(
            f"--max-batch {spec.max_batch} exceeds the largest --batch-sizes {max(spec.batch_sizes)}",
            "raise --batch-sizes or lower --max-batch",
        )
    if not (isinstance(spec.idle_s, (int, float)) and math.isfinite(spec.idle_s) and spec.idle_s >= 0):
        raise UsageError(f"--idle-time must be ≥ 0, got {spec.idle_s!r}", "pass e.g. --idle-time 2")
    for name, flag in (
        ("thermal_window_s", "thermal-window"),
        ("thermal_slope_c_per_min", "thermal-slope"),
        ("thermal_timeout_s", "thermal-timeout"),
        ("sample_hz", "sample-hz"),
    ):
        v = getattr(spec, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise UsageError(f"--{flag} must be positive, got {v!r}", f"pass a positive --{flag}")
    if spec.sample_hz > 1000:
        raise UsageError(
            f"--sample-hz must be at most 1000, got {spec.sample_hz!r}", "pass e.g. --sample-hz 10"
        )
    if not 0 < spec.confidence < 1:
        raise UsageError(
            f"--confidence must be in (0, 1), got {spec.confidence!r}", "pass e.g. --confidence 0.99"
        )
    if not 0 < spec.load <= 1.5:
        raise UsageError(f"--load must be in (0, 1.5], got {spec.load!r}", "pass e.g. --load 0.5")
    if spec.verify_policies < 1:
        raise UsageError("--verify-policies must be ≥ 1", "pass e.g. --verify-policies 2")


def _check_combinations(spec: ServeSpec) -> None:
    """Flags that belong to one scenario or exclude each other, LoadGen where it is asked for."""
    if spec.min_queries is not None and spec.min_queries > spec.max_queries:
        raise UsageError(
            f"--min-queries {spec.min_queries:,} is over --max-queries {spec.max_queries:,}",
            "lower --min-queries or raise --max-queries",
        )
    if spec.scenario != "server":
        for name, flag in (
            ("qps", "--qps"),
            ("find_capacity", "--find-capacity"),
            ("trace", "--trace"),
            ("tenants", "--tenants"),
        ):
            if getattr(spec, name):
                raise UsageError(
                    f"{flag} applies to the server scenario, not {spec.scenario}",
                    f"add --scenario server or drop {flag}",
                )
    if spec.find_capacity and spec.qps is not None:
        raise UsageError("--qps and --find-capacity exclude each other", "pass one of them")
    if spec.qps is not None:  # each within its range, the product not: 1e6 q/s for a day is 644 GiB
        from deepgap.serving.sim.arrivals import n_queries

        n_queries(spec.qps, *spec.minimums())
    if spec.find_capacity and spec.slo_s is None and not _decoder(spec):
        raise UsageError("--find-capacity needs a latency bound", "add --slo-p99 15ms")
    if spec.find_capacity and spec.tenants:
        raise UsageError("--find-capacity with --tenants is not supported", "search each model alone")
    if (
        spec.scenario == "server"
        and not spec.tenants
        and not spec.find_capacity
        and spec.qps is None
        and not spec.trace
    ):
        raise UsageError("the server scenario needs a load", "pass --qps N, --trace FILE or --find-capacity")
    if spec.loadgen:
        from deepgap.serving.loadgen.harness import available

        why = available()
        if why:
            raise UsageError(
                f"--loadgen needs MLCommons LoadGen ({why})",
                "pip install 'deepgap[serving]' (or mlcommons-loadgen), or drop --loadgen",
            )
        if spec.tenants:
            raise UsageError("--loadgen with --tenants is not supported", "drive one model at a time")
    if spec.loadgen_duration_s is not None and not spec.loadgen:  # its range: `_FLOAT_LIMITS`
        raise UsageError(
            "--loadgen-duration applies to LoadGen runs", "add --loadgen or drop --loadgen-duration"
        )
    if spec.weights and spec.tenants:
        raise UsageError("--weights applies to one model, but --tenants names several", "drop --weights")
    if spec.dataset and spec.tenants:
        raise UsageError("--dataset applies to one model, but --tenants names several", "drop --dataset")


def _decoder(spec: ServeSpec) -> bool:
    """Whether ``spec`` serves a decoder (bounded by --slo-ttft and --slo-tpot, not --slo-p99)."""
    from deepgap.serving.run.llm_spec import is_decoder

    return is_decoder(spec.model)
