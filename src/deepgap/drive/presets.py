"""The named sweeps: presets, the device's default, the host-CPU baseline's protocol, and TOML sweep files.

Why apart from `deepgap.drive.config`: the config module is the `SweepSpec` and its validation; these are
the grids built from it (a TOML file picks one as its base), and they change when the study's grid does.
"""

from __future__ import annotations

import sys
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.drive.config import PAPER_BATCHES, SweepSpec
from deepgap.drive.prelude import asks_for_samples

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _grid(**kw: Any) -> SweepSpec:
    return SweepSpec(**kw)


# what the GPU grids share: their engines, a thermal warm-up, and short adaptive repeats (the protocol)
_GPU_PROTOCOL: dict[str, Any] = dict(warmup=10, iterations=10, repeats=2, target_ci=0.01, max_time_s=2.0)
_GPU_GRID: dict[str, Any] = dict(
    engines=("eager", "cudagraph", "compile-freeze", "quant"),
    thermal_warmup=True,
    thermal_timeout_s=120.0,
    **_GPU_PROTOCOL,
)

PRESETS: dict[str, tuple[str, SweepSpec]] = {
    "paper": (
        "the paper exactly: ResNet-18/50/101, fp32+fp16 eager, batch 1..512, 20 warm-up, 3×100 timed",
        _grid(
            models=("resnet18", "resnet50", "resnet101"),
            precisions=("fp32", "fp16"),
            batch_sizes=PAPER_BATCHES,
        ),
    ),
    "gpu": (
        "default on a GPU: eager fp32/fp16 (the paper's baseline) beside the fastest engines (cudagraph, "
        "compile-freeze fp16 on ResNet-50, quant int8/fp8), 2 sweeps, adaptive, then the host CPU (fp32 all "
        "cores, ORT int8, thread scaling; --no-cpu-baseline skips it); budgeted for 10 min on a slow H200 host",
        _grid(
            models=("resnet18", "resnet50", "resnet101"),
            precisions=(
                "fp32",
                "fp16",
                "int8",
                "fp8",
            ),  # each engine gets those it runs (deepgap.measure.pairing)
            # eager at the paper's small and peak batch only, and compile-freeze on ResNet-50 only: session 27's
            # host ran every stage 1.2x slower than session 26's and stopped at 67 of 88 configurations in
            # 585 s; these cut about 112 of session 26's 580 s (eager batch 32: 38 s, compile-freeze on
            # ResNet-18 and -101: 74 s), about 470 s there and 560 s on such a host (results/h200/session27)
            batch_sizes=(1, 256),
            engine_axes={  # README.md (Two commands for a fresh machine) says why these
                "cudagraph": {
                    "precisions": ("fp16",),
                    "batch_sizes": (1,),
                    "memory_formats": ("channels_last",),
                },
                "compile-freeze": {
                    "precisions": ("fp16",),
                    "batch_sizes": (256,),
                    "memory_formats": ("channels_last",),
                    "models": ("resnet50",),  # ~20 s of compiling per model and sweep
                },
                # batch 1024, not 256 (issue 47): ResNet-50's best quant throughput at a batch <= 1024 is in
                # the default run, so the answer shows it. Session 26, one H200, cold caches: 88/88 in 561 s,
                # and 580 s on a slower host (485 s with quant at 256, session 24); ResNet-50 fp8 bs1024
                # 58,352 img/s (results/h200/session26)
                "quant": {"batch_sizes": (1, 1024), "memory_formats": ("channels_last",)},
            },
            sweeps=2,
            cpu_baseline=True,
            **_GPU_GRID,
        ),
    ),
    "transformers": (
        "adds transformers to the GPU grid's engines (not in the default sweep): bert-base and bert-large "
        "at sequence 128 and 384, and vit_b_16; eager fp32/fp16 at batch 1 and 256, compile-freeze fp16 at "
        "256, cudagraph fp16 at batch 1, quant fp8 (every Linear in 8 bits) at 256: 35 configurations, "
        "513 s on one H200 from cold caches (session 25); docs/transformers.md",
        _grid(
            models=("bert-base", "bert-large", "vit_b_16"),
            precisions=("fp32", "fp16"),
            batch_sizes=(1, 256),
            seq_lens=(128, 384),
            engine_axes={
                "cudagraph": {"precisions": ("fp16",), "batch_sizes": (1,)},
                "compile-freeze": {"precisions": ("fp16",), "batch_sizes": (256,)},
                "quant": {"precisions": ("fp8",), "batch_sizes": (256,)},
            },
            sweeps=1,
            **_GPU_GRID,
        ),
    ),
    "cpu": (
        "default on a CPU: ResNet-18/50 fp32, batch 1..8, thread scaling, adaptive; ≤ 15 min on 2 cores",
        _grid(
            models=("resnet18", "resnet50"),
            precisions=("fp32",),
            batch_sizes=(1, 2, 4, 8),
            warmup=3,
            iterations=5,
            repeats=3,
            target_ci=0.02,
            max_time_s=10.0,
        ),
    ),
    "quick": (
        "a few minutes on a 2-core CPU: ResNet-18 fp32, batch 1 and 4",
        _grid(
            models=("resnet18",),
            precisions=("fp32",),
            batch_sizes=(1, 4),
            warmup=2,
            iterations=5,
            repeats=2,
            target_ci=0.05,
            max_time_s=5.0,
        ),
    ),
}


def preset(name: str) -> SweepSpec:
    """The named preset's spec."""
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}", f"choose one of: {', '.join(PRESETS)}")
    return PRESETS[name][1]


def thread_ladder(cpu_count: int) -> tuple[int, ...]:
    """1, 2, 4 … and ``cpu_count`` itself: the thread counts a CPU's scaling is measured at."""
    threads = tuple(2**i for i in range(cpu_count.bit_length()) if 2**i <= cpu_count)
    return threads if cpu_count in threads else (*threads, cpu_count)


def default_spec(has_gpu: bool, cpu_count: int) -> SweepSpec:
    """The sweep run when no preset is named: the GPU grid (its host CPU after it), or the CPU grid."""
    if has_gpu:
        return preset("gpu").replace(device="cuda", cpu_cores=cpu_count)
    return preset("cpu").replace(device="cpu", threads=thread_ladder(cpu_count))


def decode_defaults(base: SweepSpec, has_gpu: bool) -> SweepSpec:
    """The device's default grid made a decode sweep: eager, bf16 on a GPU (fp32 on a CPU), batches 1, 8, 3 repeats.

    Torch's default threads; the models stay the user's to name (a decoder, `llm_workload`). On a GPU the
    grid's ``cpu_baseline`` stays on: the host CPU's decode after it (`cpu_baseline_spec`, `plan.host_cpu`).
    """
    return base.replace(
        engines=("eager",),
        precisions=("bf16",) if has_gpu else ("fp32",),
        batch_sizes=(1, 8),
        memory_formats=("nchw",),
        threads=(),
        engine_axes={},
        inputs=("default",),
        repeats=3,  # 3 × 127 TPOT samples at 128 out: 381 ≥ 368, a p99 (analysis.tails)
    )


# The host-CPU part of a GPU run (`cpu_baseline`): the paper's small batches, fp32 eager with all cores, int8
# through ONNX Runtime, and thread scaling of one model at batch 1. Budgeted at ~1.5 min on a 16-core host
# (most of it ONNX export and quantization, cached after the first run), so each configuration gets fewer
# iterations than the GPU grid's: 2 warm-up, 2 repeats of 4 timed (+ 4 pipelined), adaptive to 5% within
# 1.5 s, 0.5 s energy windows, one pass. docs/cpu-baseline.md gives the estimate behind the budget.
CPU_BASELINE_BATCHES = (1, 8)
CPU_BASELINE_INT8_ENGINE = "onnxruntime"
CPU_BASELINE_SCALING_MODEL = "resnet50"


# The host-CPU part of a GPU decode sweep (issue 51, item 5): the sweep's decoders of at most 2B parameters
# (the 1B shape; an 8B model in fp32 reads 32 GB per token, minutes per configuration on a CPU), fp32 eager
# with all cores at batch 1 and 4, the sweep's shortest prompt (at most 64 tokens: the prefill is a CPU's
# costly part) and 16 output tokens (15 decode steps: TPOT at these lengths is the weights' read), 1 warm-up
# and 2 timed generations. About 1 min for the 1B shape on a 16-core host (docs/cpu-baseline.md).
CPU_DECODE_BATCHES = (1, 4)
CPU_DECODE_MAX_PARAMS = 2_000_000_000
CPU_DECODE_MAX_INPUT = 64
CPU_DECODE_OUTPUT = 16


def cpu_baseline_spec(spec: SweepSpec, cpu_count: int) -> SweepSpec:
    """The sweep the host-CPU part of ``spec`` is measured with (its models, seed, weights and telemetry).

    ``cpu_count``: the host's cores when ``spec.cpu_cores`` is unset (a spec not yet started). A decode
    sweep's host part is fp32 eager decode (`CPU_DECODE_BATCHES`), not the image grid's.
    """
    cores = spec.cpu_cores or cpu_count
    # what every host-CPU part is, whatever its workload: the host's cores, no idle baseline or thermal
    # warm-up (a CPU has neither), and no host-CPU part of its own
    host = dict(device="cpu", idle_s=0.0, thermal_warmup=False, cpu_baseline=False, cpu_cores=cores)
    if spec.workload == "decode":
        return spec.replace(
            **host,
            engines=("eager",),
            precisions=("fp32",),
            batch_sizes=CPU_DECODE_BATCHES,
            threads=(cores,),
            engine_axes={},
            warmup=1,
            repeats=2,
            sweeps=1,
        )
    return spec.replace(
        **host,
        engines=("eager", CPU_BASELINE_INT8_ENGINE),
        precisions=("fp32", "int8"),
        batch_sizes=CPU_BASELINE_BATCHES,
        memory_formats=("nchw",),
        threads=thread_ladder(cores),
        engine_axes={"eager": {"precisions": ("fp32",)}, CPU_BASELINE_INT8_ENGINE: {"precisions": ("int8",)}},
        warmup=2,
        iterations=4,
        repeats=2,
        sweeps=1,
        target_ci=0.05,
        max_time_s=1.5,
        energy_window_s=0.5,
        include_transfer=False,
    )


def load_toml(path: str, base: SweepSpec | None = None) -> SweepSpec:
    """Read a TOML sweep file: top-level keys are `SweepSpec` fields; ``preset = "..."`` picks the base."""
    from deepgap.store.paths import kind_of

    kind = kind_of(path)
    if kind and kind != "a directory":  # a FIFO would block the read forever
        raise UsageError(f"config file {path!r} is {kind}", "pass a TOML sweep file")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(
            f"config file {path!r} does not exist", "pass the path of a TOML sweep file"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path!r} is not valid TOML ({exc})", "fix the syntax") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"config file {path!r} is not a text file (not UTF-8)", "pass a TOML sweep file"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"config file {path!r} cannot be read ({exc.strerror})", "pass a readable TOML file"
        ) from None
    if "sweep" in data:  # a [sweep] table: nothing may sit beside it (a misplaced table would be ignored)
        if not isinstance(data["sweep"], dict):
            raise UsageError(
                f"config file {path!r}: sweep must be a table, got {data['sweep']!r}",
                "write [sweep] on a line of its own, then key = value lines",
            )
        others = [k for k in data if k != "sweep"]
        if others:
            raise UsageError(
                f"config file {path!r} has {others[0]!r} beside the [sweep] table",
                "put every setting inside [sweep], or drop the [sweep] header",
            )
        data = data["sweep"]
    data = dict(data)
    if "options" in data:
        from deepgap.drive.options import check_user_options

        check_user_options(data["options"], f"config file {path!r}")
    if "preset" in data:
        if not isinstance(data["preset"], str):
            raise UsageError(
                f"config file {path!r}: preset must be a name, got {data['preset']!r}",
                f'write e.g. preset = "quick" ({", ".join(PRESETS)})',
            )
        base = preset(data.pop("preset"))
    # as --no-telemetry beside a flag that asks for samples (`deepgap.commands.session_flags`)
    if data.get("telemetry") is False:
        wanted = asks_for_samples(data)
        if wanted:
            raise UsageError(
                f"config file {path!r}: telemetry = false takes no samples, but {', '.join(wanted)} asks for them",
                f"drop telemetry = false or {', '.join(wanted)}",
            )
    return SweepSpec.from_dict(data, base)
