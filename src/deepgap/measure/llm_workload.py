"""The ``decode`` workload of a sweep, as the parent knows it: which models, engines and precisions run it.

Why torch-free and apart from `llm_timing`: the parent validates a sweep (``--workload decode``) and
plans its configurations without importing torch; the worker measures them
(`deepgap.measure.decode_config`). A decode configuration is a greedy generation of ``output_len``
tokens after a prompt of ``input_len`` tokens, at a batch of sequences (`deepgap.core.records.ConfigSpec`'s
``input_len``/``output_len``).

**Engines.** A sweep's engine names map onto the decode steps of `deepgap.measure.llm_steps`; an engine
without a line here has no decode path (ONNX Runtime and TensorRT take a forward pass of a fixed graph,
not a cache that grows). The ``quant`` engine decodes with every Linear in fp8 or int8 (the quant
engine's Linear path, `deepgap.measure.quant.linear`: weight-only at a small batch, activations scaled per
token above it), compiled and captured as one CUDA graph.

**KV cache.** ``--kv-caches`` (`KV_CACHES`) crosses every decode configuration with the cache's format:
"auto" keeps the decoder's own dtype (``ConfigSpec.kv_cache`` None: every key as before the axis), "fp8"
stores e4m3 codes at scale 1, saturating (vLLM's fp8 cache without calibration); the worker's decode is
checked against fp32 as every decode row is.

**Precisions.** The floating-point ones, the model cast to the precision's dtype; and ``fp8``/``int8``
for the ``quant`` engine only (`QUANT_PRECISIONS`): the worker's
`deepgap.measure.decode_config.LINEAR_SWAPS` replaces the decoder's ``nn.Linear`` layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.precision import PRECISIONS
from deepgap.measure.models.llama_config import SHAPES, LlamaShape, check_run, is_config_path, shape_of

WORKLOADS = ("forward", "decode")
DEFAULT_INPUT_LEN = 128
DEFAULT_OUTPUT_LEN = 128
DECODE_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
QUANT_PRECISIONS = ("fp8", "int8")  # the quant engine's decode: 8-bit Linears (module doc)
# the KV cache's formats a decode sweep crosses its configurations with (module doc): "auto" is the decoder's
# own dtype (None in a `ConfigSpec`, so every key stored before the axis is unchanged)
KV_CACHES = ("auto", "fp8")
# greedy tokens compared with the fp32 reference's (and logits compared), over at most this many
# first output tokens of at most `CHECK_ROWS` sequences: enough to catch a wrong step, cheap beside the run
CHECK_TOKENS = 16
CHECK_ROWS = 4


@dataclass(frozen=True)
class DecodeStep:
    """How an engine name runs decode: a `llm_steps.STEPS` kind, its compile mode, whether it needs CUDA."""

    step: str
    compile_mode: str | None = None
    cuda_only: bool = False
    precisions: tuple[str, ...] = DECODE_PRECISIONS  # the precisions it decodes in


DECODE_ENGINES: dict[str, DecodeStep] = {
    "eager": DecodeStep("eager"),
    "compile": DecodeStep("compile", "default"),
    "compile-max-autotune": DecodeStep("compile", "max-autotune-no-cudagraphs"),
    "cudagraph": DecodeStep("cuda-graph", None, cuda_only=True),
    # reduce-overhead is torch.compile with CUDA graphs: here the compiled step captured as one graph
    "compile-reduce-overhead": DecodeStep("cuda-graph", "default", cuda_only=True),
    # compiled, so the norms, RoPE and the activations' quantization fuse around the 8-bit GEMMs, then one graph
    "quant": DecodeStep("cuda-graph", "default", cuda_only=True, precisions=QUANT_PRECISIONS),
}


def decoder_shape(model: str) -> LlamaShape | None:
    """The shape of a decoder model a sweep names (a registered Llama shape or a local config), else None.

    A local HF ``config.json`` (or the folder holding it, `is_local_config`) is read here, so a missing or
    malformed one is one `UsageError` line before anything runs (`llama_config.shape_of`).
    """
    if model in SHAPES:
        return SHAPES[model]
    return shape_of(model) if is_local_config(model) else None


def is_local_config(model: str) -> bool:
    """Whether a model name is a path to a local HF config (a ``.json`` file, a path, an existing folder)."""
    return is_config_path(model)


def spec_kv_cache(name: str) -> str | None:
    """A sweep's KV-cache name as a `ConfigSpec.kv_cache`: "auto" is None (the decoder's own dtype)."""
    return None if name == "auto" else name


def kv_itemsize(precision: str, kv_cache: str | None) -> int:
    """Bytes per cached K or V element as a decoder is built (``kv_cache``: a `ConfigSpec.kv_cache`).

    One as fp8 codes; else the precision's own, bf16 beside 8-bit Linears. One rule for the sweep's and serve's
    memory checks (`check_decode`, `deepgap.serving.run.llm_spec.check_decoder`).
    """
    if kv_cache == "fp8":
        return 1
    return 2 if precision in QUANT_PRECISIONS else PRECISIONS[precision].itemsize


def kv_caches_of(kv_caches: tuple[str, ...]) -> list[str | None]:
    """The `ConfigSpec.kv_cache` values a decode sweep measures, in the order given, each once."""
    return list(dict.fromkeys(spec_kv_cache(k) for k in kv_caches)) or [None]


def check_decode(
    models: tuple[str, ...],
    engines: tuple[str, ...],
    precisions: tuple[str, ...],
    batch_sizes: tuple[int, ...],
    input_lens: tuple[int, ...],
    output_lens: tuple[int, ...],
    kv_caches: tuple[str, ...] = ("auto",),
) -> None:
    """One `UsageError` line for a decode sweep that cannot run (no decoder, no decode path, out of range).

    A model that is no decoder, an engine or precision without a decode path, a length past a model's
    context, fewer than 2 output tokens, a batch or KV cache out of range.
    """
    for m in models:
        if decoder_shape(m) is None:
            raise UsageError(
                f"--workload decode needs a decoder model, and {m!r} is not one",
                f"use one of: {', '.join(SHAPES)} (or drop --workload decode)",
            )
    for e in engines:
        if e not in DECODE_ENGINES:
            raise UsageError(
                f"engine {e!r} has no decode step", f"use --engines from: {', '.join(DECODE_ENGINES)}"
            )
    runs = tuple(dict.fromkeys(p for e in engines for p in DECODE_ENGINES[e].precisions))
    for p in precisions:
        if p not in runs:
            raise UsageError(
                f"decode with {', '.join(engines)} runs {', '.join(runs)}; {p!r} is not among them",
                f"pass --precisions from: {', '.join(runs)}"
                + (" (fp8/int8 weights: --engines quant)" if p in QUANT_PRECISIONS else ""),
            )
    for name, lens in (("input-lens", input_lens), ("output-lens", output_lens)):
        bad = [v for v in lens if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise UsageError(f"--{name} has {bad[0]!r}", f"pass positive integers, e.g. --{name} 128")
    if any(o < 2 for o in output_lens):
        raise UsageError(
            "--output-lens 1 times no decode step (the first token comes from the prefill)",
            "pass output lengths of at least 2, e.g. --output-lens 128",
        )
    # the largest cache element the sweep builds: one byte only where every cache is fp8
    itemsize = max(kv_itemsize(p, spec_kv_cache(k)) for p in precisions for k in kv_caches or ("auto",))
    for m in models:
        shape = decoder_shape(m)
        assert shape is not None  # checked above
        for i in input_lens or (DEFAULT_INPUT_LEN,):
            for o in output_lens or (DEFAULT_OUTPUT_LEN,):
                if i + o > shape.max_positions:
                    raise UsageError(
                        f"input {i} + output {o} tokens is past {m}'s context of {shape.max_positions}",
                        f"keep --input-lens + --output-lens within {shape.max_positions}",
                    )
                for b in batch_sizes:
                    check_run(shape, b, i + o, itemsize)


def lens_of(input_lens: tuple[int, ...], output_lens: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (input, output) length pairs a decode sweep measures: every input length × every output length."""
    ins = tuple(dict.fromkeys(input_lens)) or (DEFAULT_INPUT_LEN,)
    outs = tuple(dict.fromkeys(output_lens)) or (DEFAULT_OUTPUT_LEN,)
    return [(i, o) for i in ins for o in outs]


def check_workload(spec: Any) -> None:
    """A sweep's workload (a `deepgap.drive.config.SweepSpec`, read by its fields): known and consistent.

    Decode's axes only with decode; decode only where it can run (`check_decode`), and without the
    forward-only settings (sequence lengths, input modes, transfer, a dataset, weights).
    """
    if spec.workload not in WORKLOADS:
        raise UsageError(f"unknown workload {spec.workload!r}", f"choose from {', '.join(WORKLOADS)}")
    check_kv_caches(spec.kv_caches)
    if spec.workload != "decode":
        if spec.input_lens or spec.output_lens:
            raise UsageError(
                "--input-lens and --output-lens are decode axes", "add --workload decode, or drop them"
            )
        if tuple(spec.kv_caches) != ("auto",):
            raise UsageError("--kv-caches is a decode axis", "add --workload decode, or drop --kv-caches")
        return
    clash = [
        f
        for f, on in (
            ("--seq-lens", bool(spec.seq_lens)),
            ("--inputs", tuple(spec.inputs) != ("default",)),
            ("--include-transfer", spec.include_transfer),
            ("--dataset", bool(spec.dataset)),
            ("--weights", bool(spec.weights)),
        )
        if on
    ]
    if clash:
        raise UsageError(
            f"{clash[0]} does not apply to --workload decode",
            "drop it (decode's lengths are --input-lens and --output-lens)",
        )
    batches = {b for ax in spec.engine_axes.values() for b in ax.get("batch_sizes", ())}
    check_decode(
        spec.models,
        spec.engines,
        spec.precisions,
        tuple(sorted(batches | set(spec.batch_sizes))),
        spec.input_lens,
        spec.output_lens,
        spec.kv_caches,
    )


def check_kv_caches(kv_caches: tuple[str, ...], flag: str = "--kv-caches") -> None:
    """One `UsageError` line for a KV-cache axis that is empty or names an unknown format (`KV_CACHES`).

    ``flag`` names the option the fix is typed in: the sweep's ``--kv-caches`` or serve's ``--kv-cache``.
    """
    if not kv_caches:
        raise UsageError("no KV cache given", f"pass e.g. {flag} auto (known: {', '.join(KV_CACHES)})")
    for k in kv_caches:
        if k not in KV_CACHES:
            raise UsageError(f"unknown KV cache {k!r}", f"choose from {', '.join(KV_CACHES)} ({flag})")
