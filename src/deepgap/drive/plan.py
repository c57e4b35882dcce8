"""Expand a validated `SweepSpec` into the ordered list of `ConfigSpec` points (pure).

Order: sweep passes outermost (each runs in its own worker process, `runner.SweepRunner`); inside
a pass, configuration groups (precision × model × memory format × engine × threads; × sequence length for
a text model, whose memory format does not apply; × input mode, `records.INPUT_MODES`; a decode sweep's
length pairs × KV-cache formats, `llm_workload.KV_CACHES`) in the paper's
Algorithm 1 order for the first pass and shuffled for later ones (seeded by ``spec.seed`` and the
pass, so the plan stays a pure, reproducible function), so that a slow drift of the machine (heat,
clocks) does not line up with the same configurations in every pass; batch sizes ascend inside a
group, so that an out-of-memory at batch B can skip the larger batches of the same group.

An engine is paired only with the precisions it runs, on its own axes where the sweep sets them
(`deepgap.measure.pairing`, which `config.validate` checks with too). What a *device* cannot run (fp8 below
compute capability 8.9, …) still becomes a stored ``skipped`` row with its reason: that is a finding,
not a planning error.

A GPU sweep with ``cpu_baseline`` ends with its host CPU's part (`host_cpu`, device ``cpu``): the run
measures it after the GPU's configurations, in a worker of its own (`deepgap.api.run`).
"""

from __future__ import annotations

import itertools
import os
import random

from deepgap.core.records import TEXT_INPUTS, ConfigSpec, spec_input_mode
from deepgap.drive import presets
from deepgap.drive.config import SweepSpec
from deepgap.drive.presets import CPU_BASELINE_INT8_ENGINE, CPU_BASELINE_SCALING_MODEL, cpu_baseline_spec
from deepgap.measure.llm_workload import DEFAULT_INPUT_LEN, decoder_shape, kv_caches_of, lens_of
from deepgap.measure.models import resolve_model
from deepgap.measure.pairing import axes, check_pairs


def _ordered_union(lists) -> tuple:
    out: list = []
    for values in lists:
        out += [v for v in values if v not in out]
    return tuple(out)


def expand(spec: SweepSpec, device: str) -> list[ConfigSpec]:
    """All configurations of ``spec`` on ``device`` (``auto`` resolved), then its host CPU's (`host_cpu`)."""
    out = _expand_device(spec, device)
    if spec.cpu_baseline and device != "cpu":
        out += [c for c in host_cpu(spec) if c not in out]
    return out


def host_cpu_decode(spec: SweepSpec) -> list[ConfigSpec]:
    """The host-CPU part of a GPU decode sweep: fp32 eager decode of its small decoders (`presets`' bounds).

    Decoders above `presets.CPU_DECODE_MAX_PARAMS` are left out (the views say so); the prompt is the
    sweep's shortest, at most `presets.CPU_DECODE_MAX_INPUT` tokens, the output `presets.CPU_DECODE_OUTPUT`.
    Its cache is the decoder's own dtype whatever the sweep's ``kv_caches``: the baseline is the plain decode.
    """
    cores = int(cpu_baseline_spec(spec, os.cpu_count() or 1).cpu_cores or 1)
    i = min(min(spec.input_lens or (DEFAULT_INPUT_LEN,)), presets.CPU_DECODE_MAX_INPUT)
    o = presets.CPU_DECODE_OUTPUT
    out = []
    for model in spec.models:
        shape = decoder_shape(model)
        if shape is None or shape.params() > presets.CPU_DECODE_MAX_PARAMS or i + o > shape.max_positions:
            continue
        for bs in presets.CPU_DECODE_BATCHES:
            out.append(
                ConfigSpec(
                    model=model,
                    engine="eager",
                    precision="fp32",
                    batch_size=bs,
                    device="cpu",
                    threads=cores,
                    resolution=i,
                    input_len=i,
                    output_len=o,
                )
            )
    return out


def host_cpu(spec: SweepSpec) -> list[ConfigSpec]:
    """The host-CPU part of a GPU sweep (`presets.cpu_baseline_spec`), in the order it is measured.

    fp32 eager with all cores at the small batches, thread scaling of one model at batch 1 (ResNet-50 where
    the sweep has it), then int8 through ONNX Runtime (last: its export and quantization cost the most; where
    onnxruntime is not installed those rows are stored skipped, with that reason). Thread counts are
    explicit (``spec.cpu_cores``, stored with the run), so ``--resume`` plans exactly the same keys. A decode
    sweep's host part is `host_cpu_decode`'s.
    """
    if spec.workload == "decode":
        return host_cpu_decode(spec)
    cpu = cpu_baseline_spec(spec, os.cpu_count() or 1)
    cores = int(cpu.cpu_cores or 1)
    out: list[ConfigSpec] = []

    def add(model: str, engine: str, precision: str, bs: int, threads: int) -> None:
        entry = resolve_model(model)
        # a text model at the sweep's shortest sequence (a CPU's fp32 encoder is slow), as a text row: seq_len set
        seq = min(spec.seq_lens or (entry.default_resolution,)) if entry.is_text else None
        c = ConfigSpec(
            model=model,
            engine=engine,
            precision=precision,
            batch_size=bs,
            device="cpu",
            threads=threads,
            resolution=seq or spec.resolution or entry.default_resolution,
            seq_len=seq,
        )
        if c not in out:
            out.append(c)

    for model in spec.models:
        for bs in cpu.batch_sizes:
            add(model, "eager", "fp32", bs, cores)
    scaling = CPU_BASELINE_SCALING_MODEL if CPU_BASELINE_SCALING_MODEL in spec.models else spec.models[0]
    for t in cpu.threads:
        add(scaling, "eager", "fp32", 1, t)
    for model in spec.models:
        for bs in cpu.batch_sizes:
            add(model, CPU_BASELINE_INT8_ENGINE, "int8", bs, cores)
    return out


def _expand_device(spec: SweepSpec, device: str) -> list[ConfigSpec]:
    """The sweep's own grid on ``device``."""
    check_pairs(spec)
    threads: tuple[int | None, ...] = tuple(spec.threads) if spec.threads else (None,)
    per = {e: axes(spec, e) for e in spec.engines}
    precisions = _ordered_union([spec.precisions, *(a["precisions"] for a in per.values())])
    formats = _ordered_union([spec.memory_formats, *(a["memory_formats"] for a in per.values())])
    out: list[ConfigSpec] = []
    for sweep in range(spec.sweeps):
        groups = [
            g
            for g in itertools.product(precisions, spec.models, formats, spec.engines, threads, spec.inputs)
            if g[0] in per[g[3]]["precisions"]
            and g[1] in per[g[3]]["models"]
            and g[2] in per[g[3]]["memory_formats"]
            and g[5] in per[g[3]]["inputs"]
        ]
        if sweep > 0:  # sweep 0 keeps the paper's order; later ones are shuffled, reproducibly
            order = random.Random(f"{spec.seed}:{sweep}").sample(range(len(groups)), len(groups))
            groups = [groups[i] for i in order]
        for precision, model, mf, engine, t, inp in groups:
            entry = resolve_model(model)
            if entry.is_text and mf != per[engine]["memory_formats"][0]:
                continue  # a token batch has no memory format: one group per engine, stored as "nchw"
            if inp in TEXT_INPUTS and not entry.is_text:
                continue  # an image has no sequence lengths: a mixed-length input is a text model's only
            for (size, seq, lens), kv in itertools.product(_points(spec, entry), _kv_caches(spec)):
                for bs in sorted(set(per[engine]["batch_sizes"])):
                    out.append(
                        ConfigSpec(
                            model=model,
                            engine=engine,
                            precision=precision,
                            batch_size=bs,
                            device=device,
                            memory_format="nchw" if entry.is_text else mf,
                            threads=t,
                            resolution=size,
                            sweep=sweep,
                            include_transfer=spec.include_transfer,
                            seq_len=seq,
                            input_mode=spec_input_mode(inp, spec.seq_len_dist),
                            input_len=lens[0] if lens else None,
                            output_len=lens[1] if lens else None,
                            kv_cache=kv,
                        )
                    )
    return out


def _kv_caches(spec: SweepSpec) -> list[str | None]:
    """The KV-cache formats of a decode sweep (`llm_workload.KV_CACHES`; "auto" is None); a forward's: None.

    Crossed with every length pair, inside it and outside the batches: each format is a group of its own
    (`ConfigSpec.group`), so an OOM at batch B skips only the larger batches of its own format.
    """
    return kv_caches_of(spec.kv_caches) if spec.workload == "decode" else [None]


def _points(spec: SweepSpec, entry) -> list[tuple[int, int | None, tuple[int, int] | None]]:
    """(input size, sequence length, decode lengths) of one model's configurations, batch aside.

    Decode (``spec.workload``): one point per (input, output) length pair, its input length as the
    size and no ``seq_len`` (a decode row is no forward pass over ``seq_len`` tokens); else `_sizes`.
    """
    if spec.workload == "decode":
        return [(i, None, (i, o)) for i, o in lens_of(spec.input_lens, spec.output_lens)]
    return [(size, size if entry.is_text else None, None) for size in _sizes(spec, entry)]


def _sizes(spec: SweepSpec, entry) -> tuple[int, ...]:
    """Input sizes of one model: its sequence lengths (``seq_lens``) for a text model, else its resolution.

    A text model's sequence length is also its ``resolution`` (see `records.ConfigSpec`).
    """
    if entry.is_text:
        return tuple(dict.fromkeys(spec.seq_lens)) or (entry.default_resolution,)
    return (spec.resolution or entry.default_resolution,)
