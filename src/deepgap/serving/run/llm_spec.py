"""``deepgap serve`` for a decoder (llama-*): its flags checked, its requests, bounds and build request.

Why its own module, as `deepgap.serving.run.text_spec`: a decoder's request has a prompt length and an
output length (``--input-len-dist``, ``--output-len-dist``, the ``--seq-len-dist`` syntax), its latency is
two figures with two bounds (``--slo-ttft``, ``--slo-tpot``; MLPerf's 2 s and 100 ms by default), and its
server batches continuously (`deepgap.serving.sim.continuous`) with ``--max-batch`` slots. What it does
not do yet is refused here with one line (exit 2).
"""

from __future__ import annotations

from typing import Any

from deepgap.core.errors import UsageError
from deepgap.serving.sim.llm_service import LlmLoad
from deepgap.serving.sim.packing import prefill_mode
from deepgap.serving.sim.seqlen import parse_seq_len_dist

FLOAT_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# engine → the precisions it serves a decoder in: the sweep's decode steps (`deepgap.measure.llm_workload`'s
# DECODE_ENGINES), each slot count's step captured as a CUDA graph on a GPU; compile-reduce-overhead compiles
# it first (half precision, as the sweep runs it), quant swaps every Linear for an 8-bit one and compiles
LLM_ENGINES: dict[str, tuple[str, ...]] = {
    "eager": FLOAT_PRECISIONS,
    "cudagraph": FLOAT_PRECISIONS,
    "compile-reduce-overhead": ("fp16", "bf16"),
    "quant": ("fp8", "int8"),
}
SLO_TTFT_S, SLO_TPOT_S = 2.0, 0.1  # MLPerf's Llama-3.1-8B Server limits
DEFAULT_LEN = 128  # prompt and output tokens when no distribution is given
DECODER_FLAGS = (
    ("input_len_dist", "--input-len-dist"),
    ("output_len_dist", "--output-len-dist"),
    ("slo_ttft_s", "--slo-ttft"),
    ("slo_tpot_s", "--slo-tpot"),
)


def is_decoder(model: str) -> bool:
    """Whether ``model`` is a registered decoder shape (served with continuous batching)."""
    from deepgap.measure.models.llama_config import SHAPES

    return model in SHAPES


def llm_load(spec: Any) -> LlmLoad:
    """The requests' prompt and output lengths (a `UsageError` for a bad spec or one past the context)."""
    from deepgap.measure.models.llama_config import SHAPES

    shape = SHAPES[spec.model]
    top = shape.max_positions
    ins = parse_seq_len_dist(spec.input_len_dist, min(DEFAULT_LEN, top // 2), top, "--input-len-dist")
    outs = parse_seq_len_dist(spec.output_len_dist, min(DEFAULT_LEN, top // 2), top, "--output-len-dist")
    if outs.min_len < 2:
        raise UsageError(
            f"--output-len-dist {outs.label()} has outputs under 2 tokens (no decode step to time)",
            "pass output lengths of at least 2",
        )
    load = LlmLoad(ins, outs)
    if load.cache_len > top:
        raise UsageError(
            f"prompts up to {ins.max_len} plus outputs up to {outs.max_len} tokens is {load.cache_len}, past "
            f"{spec.model}'s context of {top}",
            "shorten --input-len-dist or --output-len-dist",
        )
    return load


# A served decoder's slot counts on a GPU when --batch-sizes is not given: the four largest of these whose KV
# cache fits `SLOT_CACHE_BYTES` (with 8B's fp8 weights, or bf16's 16 GB, beside it on an 80 GB card). Why not
# the image servers' 1-128: a decoder's capacity grows with its slots until TPOT binds (8B fp8 on one H200,
# session 45: 512 slots served 17,754 output tokens/s at TPOT p99 27 ms of the 100 allowed, TTFT-bound by the
# queue for slots), and each slot count is a compile and a capture, so four, not ten
DECODER_SLOTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SLOT_CACHE_BYTES = 32e9
DEFAULT_SLOT_COUNTS = 4


def decoder_slots(spec: Any) -> tuple[int, ...]:
    """The default slot counts for ``spec``'s decoder on a GPU (`DECODER_SLOTS`): its cache's bytes decide."""
    from deepgap.measure.models.llama_config import SHAPES

    per_slot = llm_load(spec).cache_len * SHAPES[spec.model].kv_bytes_per_token(_cache_itemsize(spec))
    fits = [s for s in DECODER_SLOTS if s * per_slot <= SLOT_CACHE_BYTES] or [1]
    return tuple(fits[-DEFAULT_SLOT_COUNTS:])


def _cache_itemsize(spec: Any) -> int:
    """Bytes per cached K or V element of the served decoder (`llm_workload.kv_itemsize`; quant is 8-bit)."""
    from deepgap.measure.llm_workload import kv_itemsize, spec_kv_cache

    return kv_itemsize(spec.precision, spec_kv_cache(spec.kv_cache))


def slo_bounds(spec: Any) -> tuple[float, float]:
    """(TTFT, TPOT) bounds in seconds: the flags, else MLPerf's."""
    return (
        spec.slo_ttft_s if spec.slo_ttft_s is not None else SLO_TTFT_S,
        spec.slo_tpot_s if spec.slo_tpot_s is not None else SLO_TPOT_S,
    )


def check_decoder(spec: Any) -> None:
    """What serving a decoder takes; one line and exit 2 otherwise."""
    from deepgap.measure.models.llama_config import SHAPES, check_run

    if spec.tenants:
        raise UsageError("--tenants does not serve decoders yet", "serve the decoder alone (--model NAME)")
    if spec.scenario != "server":
        raise UsageError(
            f"a decoder is served in the server scenario only, not {spec.scenario}",
            "pass --scenario server (continuous batching under Poisson arrivals)",
        )
    _check_engine(spec.engine, spec.precision)
    prefill_mode()  # DEEPGAP_SERVE_PREFILL: a bad value stops here, before any worker starts
    for flag, bad in (
        ("--loadgen", spec.loadgen),
        ("--dataset", spec.dataset),
        ("--weights", spec.weights),
        ("--resolution", spec.resolution is not None),
        ("--memory-format", spec.memory_format != "nchw"),
        ("--seq-len-dist", spec.seq_len_dist is not None),
        ("--padding", spec.padding != "longest"),
        ("--slo-p99", spec.slo_s is not None),
        ("--max-delay", spec.max_delay_s is not None),
    ):
        if bad:
            fix = (
                "bound a decoder with --slo-ttft and --slo-tpot"
                if flag == "--slo-p99"
                else "use --input-len-dist and --output-len-dist"
                if flag in ("--seq-len-dist", "--padding")
                else f"drop {flag} for {spec.model}"
            )
            raise UsageError(f"{flag} does not apply to serving a decoder ({spec.model})", fix)
    load = llm_load(spec)
    top = max(spec.buckets("cpu" if spec.device == "cpu" else "cuda"))
    check_run(SHAPES[spec.model], top, load.cache_len, _cache_itemsize(spec))  # the engine checked above


def _check_engine(engine: str, precision: str) -> None:
    """An engine that serves decoders, in a precision it serves them in (`LLM_ENGINES`); else one line."""
    if engine not in LLM_ENGINES:
        raise UsageError(
            f"deepgap serve decodes with {', '.join(LLM_ENGINES)}, not {engine}",
            "pass --engine cudagraph (compile-reduce-overhead: compiled; quant: 8-bit weights)",
        )
    runs = LLM_ENGINES[engine]
    if precision not in runs:
        quant = precision in LLM_ENGINES["quant"]
        raise UsageError(
            f"--engine {engine} serves a decoder in {', '.join(runs)}, not {precision}",
            "pass --engine quant for fp8 or int8 weights"
            if quant
            else f"pass --precision {' or '.join(runs)}"
            + ("" if engine != "quant" else " (a float precision: --engine cudagraph)"),
        )


def check_kv_cache(kv_cache: Any) -> None:
    """``--kv-cache`` names a format the decoders' cache has (`llm_workload.KV_CACHES`); one line otherwise.

    Why one value: a serve run serves one configuration (one engine, one precision), so its cache is one
    format; the sweep's ``--kv-caches`` crosses several.
    """
    from deepgap.measure.llm_workload import check_kv_caches

    check_kv_caches((kv_cache,), "--kv-cache")


def refuse_decoder_flags(spec: Any) -> None:
    """A decoder's flags given for a model that is no decoder: one line and exit 2.

    ``--kv-cache`` too, but for its default ``auto``: an image or text model has no KV cache to hold codes.
    """
    for name, flag in DECODER_FLAGS:
        if getattr(spec, name) is not None:
            raise UsageError(
                f"{flag} applies to decoders (llama-*), and {spec.model} is not one", f"drop {flag}"
            )
    if spec.kv_cache != "auto":
        raise UsageError(
            f"--kv-cache {spec.kv_cache} applies to decoders (llama-*), and {spec.model} is not one",
            "drop --kv-cache",
        )


def llm_setup_fields(spec: Any) -> dict[str, Any]:
    """`SetupRequest`'s decoder fields: prompt lengths and decode position calibrated, the cache's length and format.

    The format as a `ConfigSpec.kv_cache` ("auto" is None), so the served configuration's key and labels are
    the sweep's for the same cache.
    """
    from deepgap.measure.llm_workload import spec_kv_cache
    from deepgap.serving.sim.seqlen import Padding, calibration_lengths

    load = llm_load(spec)
    lens = calibration_lengths(load.inputs, Padding())
    return {
        "seq_lens": lens,
        "resolution": max(lens),
        "cache_len": load.cache_len,
        "decode_position": load.decode_position(),
        "seq_len_dist": load.label(),
        "kv_cache": spec_kv_cache(spec.kv_cache),
    }
