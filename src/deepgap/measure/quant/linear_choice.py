"""Which kernel each fp8 Linear of a transformer runs in the quant engine, chosen by timing before compiling.

Why: on one H200 (session 23, bert-base seq 128 batch 256, bare CUDA-graph loop) the MLP's first Linear,
GELU and the next quantization fused in one Triton kernel on the persistent TMA core, its tile timed per
shape, ran the network at 28,320 seq/s against 26,046 for cuBLASLt + Inductor; and per shape the same
core with the bias-only epilogue beat cuBLASLt at the attention output (45.4 against 53.7 µs; ViT's 79.3
against 102.5) but lost at QKV and the second MLP Linear. So, on Hopper with ``DEEPGAP_QUANT_FUSED=tuned``
(`fused_mode`; the default since session 24, `DEFAULT_FUSED`):

- every fusable MLP chain is fused (`fused_mlp.fuse_mlp`), its tile the fastest of the Triton tiles at
  its shape (`linear_kernels.tuned`);
- every other fp8 Linear of at least `MIN_ROWS` rows times cuBLASLt's ``torch._scaled_mm`` beside the
  Triton tiles with the bias-only epilogue and keeps the fastest, so it never runs slower than cuBLASLt
  at its shape (`QuantLinear.use_tile`).

`choose_kernels` makes those choices in one eager forward before torch.compile: each candidate is timed
at the Linear's own input (once per shape and process, `gemv.fastest`), and the chosen tile is fixed in
the module, so the compiled graph and its CUDA graph run it and ``engine_info.linear_kernels`` says which
kernel and tile each Linear runs. ``DEEPGAP_QUANT_FUSED`` says how much ("mlp": the fused MLP only;
"off": cuBLASLt + Inductor everywhere, the engine before session 23).

The fused GELU is its tanh form by default (``DEEPGAP_QUANT_GELU``, `DEFAULT_GELU`), as TensorRT's
geluPlugin computes it (``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, the plugin NVIDIA's BERT builds
use). Why: on one H200 (session 24) the exact erf cost the fused ff1 +120 µs over its bias-only epilogue
against +19 µs for tanh (bert-base, 271.5 against 170.5 µs a call), and the whole engine ran bert-base at
32,521 seq/s with tanh against 28,416 with erf, ViT-B/16 at 17,074 against 15,366, at the same error
against fp32 (relL2 0.079 and 0.077, 0.110 and 0.109: the fp8 rounding dominates). ``erf`` runs the exact
GELU BERT and ViT specify; ``erf-poly`` the exact GELU with a branch-free erf (`linear_kernels`' module
doc). ``engine_info.fused.gelu`` names the form a row ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import torch
from torch import nn

from deepgap.core import switches
from deepgap.measure.models.build import hooks_installed
from deepgap.measure.quant.fused_mlp import FusedLinearGelu, fuse_mlp
from deepgap.measure.quant.linear import QuantLinear, quantize_codes
from deepgap.measure.quant.linear_kernels import (
    CUBLASLT,
    FP8_LINEAR_TILE,
    Epilogue,
    fp8_linear,
    kernel_label,
    tuned,
)
from deepgap.measure.quant.precompile import compile_all
from deepgap.measure.quant.tiles import TileConfig, linear_persistent_configs

FUSED_ENV = "DEEPGAP_QUANT_FUSED"
FUSED_MODES = switches.choices(FUSED_ENV)  # tuned, mlp, off
GELU_ENV = "DEEPGAP_QUANT_GELU"
GELU_MODES = switches.choices(GELU_ENV)  # erf, tanh, erf-poly
GELU_LABELS = {
    "erf": "exact (erf)",
    "tanh": "tanh approximation (tanh.approx.f32)",
    "erf-poly": "exact, erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7)",
}
APPROXIMATE = {"erf": "none", "tanh": "tanh", "erf-poly": "erf-poly"}  # a GELU mode → fp8_linear's name
# session 24, `deepgap run` on one H200 (bert-base seq 128 and ViT-B/16, batch 256, results/h200/session24):
# "tuned" 28,416 seq/s and 15,366 img/s with the exact GELU; "off" (cuBLASLt + Inductor) ran 26,046 and 13,780
# in session 23's bare loop (not timed in `deepgap run` since session 17's 26,572 seq/s)
DEFAULT_FUSED = switches.SWITCHES[FUSED_ENV].default  # "tuned"
# "tanh": TensorRT's GELU (module doc); ``DEEPGAP_QUANT_GELU=erf`` for the exact one
DEFAULT_GELU = switches.SWITCHES[GELU_ENV].default
MIN_ROWS = 128  # a bias-only Linear with fewer rows (a pooler at a small batch) stays on cuBLASLt untimed


def fused_mode() -> str:
    """``DEEPGAP_QUANT_FUSED``: 'tuned', 'mlp' or 'off' (unset: `DEFAULT_FUSED`); a bad value stops the prepare."""
    return switches.read(FUSED_ENV)


def gelu_mode() -> str:
    """``DEEPGAP_QUANT_GELU``: the fused epilogue's GELU, 'tanh' (unset, `DEFAULT_GELU`), 'erf' or 'erf-poly'.

    'erf': the exact GELU BERT and ViT specify; 'tanh': its tanh form (TensorRT's); 'erf-poly': exact, its
    erf branch-free (`linear_kernels.APPROXIMATE`).
    """
    return switches.read(GELU_ENV)


def modes(fused: str | None = None, gelu: str | None = None) -> tuple[str, str]:
    """(fused mode, GELU mode): each argument given, checked, else its switch's (`fused_mode`, `gelu_mode`)."""
    fused, gelu = switches.given(FUSED_ENV, fused), switches.given(GELU_ENV, gelu)  # both checked first
    return fused or fused_mode(), gelu or gelu_mode()


@dataclass(frozen=True)
class LinearKernel:
    """The kernel a group of same-shaped fp8 Linears runs: one row of ``engine_info.linear_kernels``."""

    shape: str  # "M×K×N" of the GEMM
    epilogue: str  # what its epilogue does
    kernel: str  # "cuBLASLt" (torch._scaled_mm), "Triton persistent TMA" or "Triton grouped"
    tile: str  # the Triton tile's label, "" for cuBLASLt
    names: tuple[str, ...]  # the Linears' qualified names


def unavailable(precision: str, device: str, fast: bool) -> str:
    """Why the fused and tuned kernels do not apply to this prepare ("" where they do)."""
    if precision != "fp8":
        return f"{precision}: the fused kernels are fp8 only"
    if not fast:
        return "the fp32 reference (no tensor cores)"
    dev = torch.device(device)
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (9, 0):
        return "needs a Hopper GPU (TMA; the only kind these kernels were timed on)"
    return ""


def apply(net: nn.Module, x: torch.Tensor, mode: str, gelu: str, tile: TileConfig | None = None) -> dict:
    """Fuse ``net``'s MLP chains and choose every fp8 Linear's kernel (``mode`` of `FUSED_MODES`, not 'off').

    ``gelu``: one of `GELU_MODES`; ``tile``: one fixed tile for every fused chain (tests, benchmarks),
    else each shape's fastest. Returns the engine_info entries: the chains fused, `LinearKernel` rows and
    what `precompile` compiled ahead of the timing.
    """
    fused = fuse_mlp(net, tile or "tuned", APPROXIMATE[gelu])
    compiled = precompile(net, others=mode == "tuned")
    kernels = choose_kernels(net, x, others=mode == "tuned")
    return {"fused_mlp": fused, "linear_kernels": [asdict(k) for k in kernels], "linear_precompile": compiled}


def choose_kernels(model: nn.Module, x: torch.Tensor, others: bool = True) -> list[LinearKernel]:
    """One eager forward of ``model`` on ``x`` that times and fixes each fp8 Linear's kernel (module doc).

    A `FusedLinearGelu` without a fixed tile gets its shape's fastest Triton tile; with ``others``, each
    other fp8 `QuantLinear` that `QuantLinear.tileable` and of at least `MIN_ROWS` rows gets cuBLASLt or a
    Triton tile, whichever is fastest. Returns one `LinearKernel` per (shape, epilogue, kernel, tile).
    """
    picks: dict[tuple[str, str, str, str], list[str]] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, FusedLinearGelu):
            hooks.append(m.register_forward_pre_hook(partial(_pick_fused, name=name, picks=picks)))
        elif others and isinstance(m, QuantLinear) and m.tileable() and not m.tile:
            hooks.append(m.register_forward_pre_hook(partial(_pick_plain, name=name, picks=picks)))
    with hooks_installed(hooks), torch.inference_mode():
        model(x)
    return [LinearKernel(*key, names=tuple(names)) for key, names in picks.items()]


def precompile(model: nn.Module, others: bool = True, workers: int = 16) -> dict:
    """Compile every Triton candidate `choose_kernels` will time, all at once on a thread pool (GPU only).

    Why: from cold caches the choice is mostly compiling (about 8 tiles for each of a BERT's three
    (K, epilogue) kinds, ptxas each), one after another as the tuner first launches them; submitted
    together under Triton's `AsyncCompileMode` (as `quant.precompile` does for the CNN engine's tiles) they
    overlap, and the tuner finds them compiled. Tiny operands give the same specializations (the kernels
    do not specialize on M). Anything that fails here fails, or compiles, at its first launch as before.
    """
    jobs = {}  # (K, N, GELU form or None) → the Linear's device
    for m in model.modules():
        if isinstance(m, FusedLinearGelu) and not m.tile:
            jobs[(m.in_features, m.out_features, m.approximate)] = m.weight.device
        elif others and isinstance(m, QuantLinear) and m.tileable() and not m.tile:
            jobs[(m.in_features, m.out_features, None)] = m.weight_t.device
    devices = {d.type for d in jobs.values()}
    if devices != {"cuda"} or torch.cuda.get_device_capability(next(iter(jobs.values()))) < (9, 0):
        return {"kernels": 0, "skipped": "compiled at first launch (no Hopper GPU)"}

    def launches():
        for (k, n, form), dev in jobs.items():
            a = torch.zeros((256, k), device=dev).to(torch.float8_e4m3fn)
            w = torch.zeros((n, k), device=dev).to(torch.float8_e4m3fn)
            bias = torch.zeros(n, device=dev, dtype=torch.float32 if form else torch.bfloat16)
            epi = Epilogue(1.0, bias, form is not None, 1.0 if form else None, form or "none")
            for t in (FP8_LINEAR_TILE.fit(k, n), *linear_persistent_configs(k, n, 1 if form else 2)):
                yield partial(fp8_linear, a, w, epi, t)

    return compile_all(launches(), workers)


def _kind(t: TileConfig | str) -> str:
    if t == CUBLASLT:
        return CUBLASLT
    return "Triton persistent TMA" if t.persistent else "Triton grouped"


def _pick_fused(m: FusedLinearGelu, args, name: str, picks: dict) -> None:
    x2 = args[0].reshape(-1, m.in_features)
    if m.tile:
        t = TileConfig.from_fields(m.tile)
    else:
        codes = quantize_codes(x2, m.act_scale, "fp8")
        t = tuned(codes, m.weight, Epilogue(m.scale, m.bias, True, m.out_scale, m.approximate))
        m.tile = t.fields()
    form = GELU_LABELS[next(k for k, v in APPROXIMATE.items() if v == m.approximate)]
    epilogue = f"bias, GELU {form}, fp8 codes for the next Linear"
    key = (f"{x2.shape[0]}x{m.in_features}x{m.out_features}", epilogue, _kind(t), kernel_label(t))
    picks.setdefault(key, []).append(name)


def _pick_plain(m: QuantLinear, args, name: str, picks: dict) -> None:
    x2 = args[0].reshape(-1, m.in_features)
    t: TileConfig | str = CUBLASLT
    if x2.shape[0] >= MIN_ROWS:
        codes, scale = m._quantize_input(x2)
        w = m.weight_t.t()
        epi = Epilogue(float(scale * m.w_scale), m.bias)
        t = tuned(codes, w, epi, cublaslt=lambda: m.scaled_mm(codes, scale))
        m.use_tile([] if t == CUBLASLT else t.fields())
    key = (
        f"{x2.shape[0]}x{m.in_features}x{m.out_features}",
        "bias, bf16",
        _kind(t),
        "" if t == CUBLASLT else t.label,
    )
    picks.setdefault(key, []).append(name)
