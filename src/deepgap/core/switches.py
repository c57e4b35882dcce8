"""deepgap's environment switches in one table: each one's name, values and default, checked before a run.

Why one table: a switch (a kernel path kept off until a GPU has timed it, or a default kept switchable) is
read where it acts, mostly in the worker, which inherits the environment. Read only there, a typo
(``DEEPGAP_QUANT_SDPA=fa3``) failed every configuration in its worker while the run went on; the parent could
not check it, since the readers' modules import torch. With the values here, torch-free, `check_environment`
stops a run with one line (exit 2) before its store is opened, and returns the switches that are set, which
the run records beside its environment. The modules that act on a switch take its values from here and
keep the why (each switch's docstring: `linear_choice`, `sdpa_choice`, `tiles`, `stem_choice`, `split_k`, `branch`,
`pair_choice`, `conv_tma`, `llm_fused`, `llm_attention`, `pdl_choice`, `gdc`, `llm_steps`, `row_quant`, `streamed`,
`serving.sim.packing`).

A switch whose lever was measured slower and removed stays in `RETIRED`: set to anything but its old default it
stops the run, rather than leave a user believing the lever ran.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from deepgap.core.errors import UsageError, env_choice


@dataclass(frozen=True)
class Switch:
    """One environment switch: its values, the one used when it is unset, and how a bad value is told."""

    choices: tuple[str, ...]
    default: str
    empty_is_unset: bool = True  # an empty value means unset (else it is a bad value like any other)
    fix: str = ""  # the hint after a bad value ("" → "set it to one of …")
    quote: bool = True  # the bad value shown as a Python string (NAME='x'), else bare (NAME=x)


SWITCHES: dict[str, Switch] = {
    "DEEPGAP_QUANT_FUSED": Switch(("tuned", "mlp", "off"), "tuned"),
    "DEEPGAP_QUANT_GELU": Switch(("erf", "tanh", "erf-poly"), "tanh"),
    "DEEPGAP_QUANT_SDPA": Switch(("torch", "cudnn", "flash", "efficient"), "torch"),
    "DEEPGAP_QUANT_GEMM": Switch(
        ("persistent", "narrow", "off"),
        "persistent",
        fix="set it to one of persistent, narrow, off or unset it (persistent)",
    ),
    "DEEPGAP_QUANT_STEM_POOL": Switch(("off", "on"), "off"),
    # on: the swapped super-pixel stem with the max-pool inside (`quant.stem_swap_pool`) is timed among the stems
    "DEEPGAP_QUANT_STEM_POOL_SWAP": Switch(("off", "on"), "off"),
    # off: the swapped super-pixel convolution (`stem_s2d.stem_swap_kernel`, then the pool) is not timed
    "DEEPGAP_QUANT_STEM_SWAP": Switch(("off", "on"), "on"),
    "DEEPGAP_QUANT_HEAD": Switch(("auto", "torch"), "auto"),
    "DEEPGAP_QUANT_SMALL_BATCH": Switch(("off", "split", "on"), "on"),
    "DEEPGAP_QUANT_PAIRS": Switch(("off", "on"), "on"),
    "DEEPGAP_QUANT_WHOLE": Switch(("off", "on"), "off"),  # on: timed at batch ≤ 8 (slower so far)
    # the shortcuts on a second stream at batch <= 8, timed both ways and kept where faster
    "DEEPGAP_QUANT_BRANCH": Switch(("auto", "off"), "auto"),
    # off since session 55, when its 3- and 4-stage tiles changed their output between runs (found in session 56; now
    # at most 2 stages, `conv_tma.MAX_STAGES`), and so since: 0.4% at batch 1024 on an H100 (docs/quant.md)
    "DEEPGAP_QUANT_CONV_TMA": Switch(("off", "on"), "off"),
    # where that kernel's TMA descriptors are made: by each program in global scratch (device), or once at launch
    # and passed by value (host; `quant.conv_tma`)
    "DEEPGAP_QUANT_CONV_TMA_DESC": Switch(("device", "host"), "device"),
    # a row-scaled 8-bit Linear's input quantized by one Triton kernel outside a compile (`quant.row_quant`);
    # torch: six eager ops. Opt-in: 26% off an eager prefill (H200), but the compiled prefill is the default
    "DEEPGAP_QUANT_ROW_QUANT": Switch(("torch", "triton"), "torch"),
    # streamed: a decode GEMV's tiles timed on copies of its weights that read from HBM (`quant.streamed`); step:
    # the fused GEMVs' tiles timed again in the decode step's own graph (`quant.step_tiles`)
    "DEEPGAP_GEMV_TUNE": Switch(("cached", "streamed", "step"), "cached"),
    # pinned: the fused qkv GEMV at one row takes `gemv_fused.QKV_TILE` untimed (the tuner's pick: 2.4% slower, H200)
    "DEEPGAP_DECODE_QKV_TILE": Switch(("tuned", "pinned"), "pinned"),
    "DEEPGAP_DECODE_ROPE": Switch(("mix", "fused"), "fused"),
    # kernel: a fused batch-1 step's RoPE angles from one kernel, not Inductor's copies (`llm_angles`)
    "DEEPGAP_DECODE_ANGLES": Switch(("inductor", "kernel"), "kernel"),
    "DEEPGAP_DECODE_NORM": Switch(("fold", "handoff"), "handoff"),
    "DEEPGAP_DECODE_ATTENTION": Switch(("triton", "sdpa"), "triton"),
    "DEEPGAP_DECODE_SPLIT_KV": Switch(("auto", "on", "off", "wide"), "auto", empty_is_unset=False),
    "DEEPGAP_DECODE_COMBINE": Switch(("kernel", "last-block"), "kernel", empty_is_unset=False),
    "DEEPGAP_DECODE_PDL": Switch(("auto", "on", "off"), "auto", empty_is_unset=False),
    # late (the default since session 55): under PDL each Triton kernel lets the next launch after its wait, not
    # before (early; `quant.gdc`)
    "DEEPGAP_PDL_TRIGGER": Switch(("early", "late"), "late"),
    # ahead: under PDL a kernel loads its epilogue's constants (a convolution's α and β, a GEMV's per-channel
    # scales and the next norm's γ) before its wait for the previous kernel, and what earlier kernels wrote right
    # after it, not after its K loop (`quant.launch.constants_ahead`)
    "DEEPGAP_PDL_CONSTANTS": Switch(("after", "ahead"), "ahead"),
    "DEEPGAP_DECODE_FUSED": Switch(("1", "0"), "1"),  # 0: the batch-1 quant decoder keeps the plain layer
    # auto and compiled: an engine that compiles its step compiles its prefill too, the sweep's
    # (`llm_steps.make_prefill`) and serve's packed admissions (`llm_engines.packed_prefill`); eager: neither
    "DEEPGAP_DECODE_PREFILL": Switch(("auto", "eager", "compiled"), "auto"),
    "DEEPGAP_SERVE_PREFILL": Switch(
        ("packed", "padded"),
        "packed",
        empty_is_unset=False,
        fix="set it to packed or padded (or leave it unset)",
        quote=False,
    ),  # fmt: skip
}


def choices(name: str) -> tuple[str, ...]:
    """Switch ``name``'s values."""
    return SWITCHES[name].choices


def given(name: str, value: str | None) -> str | None:
    """``value`` as a caller passed it for switch ``name`` (None: not given), checked against its values.

    A bad argument is a programming error (ValueError), not a user's: the environment's is `read`'s.
    """
    if value is not None and value not in SWITCHES[name].choices:
        raise ValueError(f"{value!r} is not one of {', '.join(SWITCHES[name].choices)}")
    return value


def read(name: str) -> str:
    """Switch ``name``'s value (its default when unset); a bad value is a `UsageError` naming the fix."""
    s = SWITCHES[name]
    return env_choice(name, s.choices, s.default, empty_is_unset=s.empty_is_unset, fix=s.fix, quote=s.quote)


# removed levers (measured slower; docs/llm.md keeps the measurements): name → (old default, when removed)
RETIRED = {
    "DEEPGAP_DECODE_WHOLE": ("off", "session 42: every batch-1 layer in one kernel, 2.7x slower"),
    "DEEPGAP_DECODE_PREFETCH": ("off", "session 42: weights asked of L2 ahead of their GEMV, slower"),
}


def check_environment() -> dict[str, str]:
    """Every switch checked (the first bad one raises); returns those set, by name, with their values.

    A `RETIRED` switch set to anything but its old default is a `UsageError` too.
    """
    for name, (old, why) in RETIRED.items():
        value = os.environ.get(name)
        if value and value != old:
            raise UsageError(f"{name}={value}: this switch was removed ({why})", f"unset {name}")
    return {name: read(name) for name in SWITCHES if os.environ.get(name)}
