"""The quant network's stem, chosen per configuration: cuDNN fp16, the fused fp16 Triton stem or the int8 stem.

Why its own module: the stem is the one layer with several formulations (a 3-channel input suits no
tensor-core kernel as it is), each with its own agreement rule against cuDNN's output; `prepare_quant`
only asks for the fastest that agrees, and records what was timed and rejected in ``info["stem"]``.

The head, the network's other end outside the convolutions, is chosen the same way (`choose_head`): torch's
average pool or `quant.head_pool`'s kernel, then cuBLAS's classifier.
"""

from __future__ import annotations

from typing import Any

import torch

from deepgap.core import switches
from deepgap.measure.quant.network import QuantNet
from deepgap.measure.quant.stem_pool import CONFIGS as POOL_CONFIGS
from deepgap.measure.quant.stem_swap_pool import TILES as SWAP_TILES
from deepgap.measure.quant.tuning import CHECK_BATCH, _agree, _sync, checked_time, time_s


def check_stem(net: QuantNet, resolution: int, device: str) -> str:
    """'triton' when the fused max-pool kernel (and format conversion) match the torch path, else 'torch'."""
    x = torch.randn(CHECK_BATCH, 3, resolution, resolution, device=device).half()
    try:
        why = _agree(net.run_stem(x, "triton"), net.run_stem(x, "torch"), net.stem.out_fmt)
    except Exception as exc:  # noqa: BLE001
        why = f"{type(exc).__name__}: {exc}"
    _sync(device)
    return "triton" if why is None else "torch"


# (kernel, input channels padded to (0: none), the Triton stems' (output pixels per block, warps[, persistent
# programs per SM])); int8pool is the int8 stem with the max-pool inside its kernel (`quant.stem_pool`: only
# the pooled output is written), int8s2d the int8 stem on 16-byte space-to-depth pixels (`quant.stem_s2d`).
# Pruned so that each variant offered wins somewhere or is its kind's representative (cuDNN is the reference):
# - session 26: in 24 quant builds (ResNet-18/50/101, batch 1 and 1024) the int8 stem won with 64x4w at batch 1
#   and the persistent 128x4w walk (3 programs an SM) at 1024; the other fused fp16 and int8 tiles never did.
# - session 29 (benchmarks/stem_split.py, one H200): on super pixels the convolution takes 1.128 ms at 1024
#   with 128x4w and 1.152 with the 3-per-SM walk, against 1.330 for the best 4-byte-pixel tile (fp8; int8
#   alike), 0.287 against 0.337 at 256, 3.8-3.9 against 4.4 µs at 1; so the 4-byte-pixel stem keeps only its
#   walk (for images of odd size, which super pixels do not take).
STEM_VARIANTS = (
    ("cudnn", 0, None),
    ("cudnn", 4, None),
    ("fused", 0, (128, 4)),
    # `stem_int8.stem_conv_persistent_kernel`: 157 registers, so 3 programs an SM fit
    ("int8", 0, (128, 4, 3)),
    ("int8s2d", 0, (128, 4)),
    ("int8s2d", 0, (128, 4, 3)),
    # `stem_s2d.stem_swap_kernel` (weights as the MMA's M side), 2 programs an SM, 2 stages: session 57's H100 timed
    # its convolution at 1.059 ms at 1024 (fp8) against 1.219 for int8s2d's 128x4w, the pool apart
    ("int8s2d", 0, (128, 4, 2, 2)),
    *(("int8pool", 0, cfg) for cfg in POOL_CONFIGS),  # (pooled rows, columns, warps, stages)
    # the swapped super-pixel convolution with the max-pool inside (session 57), behind `GATES`:
    # (pixels, warps, stages, programs an SM, pooled rows a band)
    *(("int8swap", 0, cfg) for cfg in SWAP_TILES),
)
# The int8 stem quantizes the image and the weights as well, so its 8-bit output is compared with
# cuDNN's by relative L2 (about 1% for int8 outputs, 3% for fp8 on random weights); the network's
# own check against fp32 stays the bound that matters.
STEM_INT8_REL = 0.1
# cuDNN's path rounds the convolution to fp16 before the epilogue, the fused kernel keeps fp32: their int8
# outputs differ by one step in about 1% of the elements, the fused one being the more exact.
STEM_AGREE_FRAC = 0.02
POOL_ENV = "DEEPGAP_QUANT_STEM_POOL"  # "on" offers the int8pool variants; "off" (unset): timed slower
# The variants behind a switch, and the value that offers them (every other variant is always timed):
# - int8pool (session 24, one H200): its best tile took 1.37-1.75× the unfused pair at batch 1, 256 and 1024;
# - int8swap (session 57, one H100, batch 1024, fp8): 1.95 against 1.57 ms for the unfused pair;
# - the swapped convolution (an int8s2d tile with a fourth entry): on, 0.87× the super-pixel tile there.
# Each variant offered is one more Triton compile and timing per configuration in the main job.
GATES = {
    "int8pool": POOL_ENV,
    "int8swap": "DEEPGAP_QUANT_STEM_POOL_SWAP",
    "int8s2d-swap": "DEEPGAP_QUANT_STEM_SWAP",
}


def offered(kernel: str, cfg: tuple | None = None) -> bool:
    """Whether the stem variant (``kernel``, ``cfg``) of `STEM_VARIANTS` is timed: its switch in `GATES` is on."""
    gate = "int8s2d-swap" if kernel == "int8s2d" and cfg and len(cfg) == 4 else kernel
    return gate not in GATES or switches.read(GATES[gate]) == "on"


def pool_offered() -> bool:
    """Whether the stems with the max-pool inside are timed (``DEEPGAP_QUANT_STEM_POOL``; off when unset)."""
    return offered("int8pool")


def choose_stem(
    net: QuantNet, batch: int, resolution: int, device: str, use_triton: bool, resident: bool = False
) -> dict[str, Any]:
    """The fastest stem at ``batch`` among those that agree with cuDNN's; on CUDA only.

    Variants: cuDNN's fp16 convolution (then the max-pool backend), the same with the image padded to 4
    channels, the fused Triton stem (`quant.stem_kernels`, 8-bit outputs) and the int8 stem
    (`quant.stem_int8`: in the default input mode it quantizes the fp16 batch first, inside the timed
    forward), unfused or with the max-pool in its kernel (`quant.stem_pool`). ``resident``: the input is
    int8 pixels already, so only the int8 stems can read it (cuDNN's output on the same images is still
    the reference). Returns what was timed and chosen, for ``info["stem"]``.
    """
    if not str(device).startswith("cuda"):
        if resident:
            net.stem.configure("int8", 0, None)
            return {"chosen": net.stem.variant, "reason": "not on a GPU; int8-resident input"}
        return {"chosen": "cudnn", "reason": "not on a GPU"}
    x = torch.randn(batch, 3, resolution, resolution, device=device).half()
    x = x.contiguous(memory_format=torch.channels_last)
    s = net.stem
    times: dict[str, float] = {}
    rejected: dict[str, str] = {}
    chosen: dict[str, tuple] = {}
    pixels: dict[
        bool, torch.Tensor
    ] = {}  # resident input: the int8 pixels of each layout (super pixels or not)
    ref = None
    for kernel, pad, cfg in STEM_VARIANTS:
        if not offered(kernel, cfg):
            continue  # not offered: nothing timed, nothing recorded (`GATES`)
        try:
            s.configure(kernel, pad, cfg)
        except ValueError as exc:  # a layout this stem's kernel or stride does not fit
            rejected[f"{kernel}+{cfg}"] = str(exc)[:300]
            continue
        name = s.variant
        chosen[name] = (kernel, pad, cfg)
        if kernel == "fused" and (not use_triton or s.out_fmt not in ("int8", "fp8")):
            rejected[name] = "needs Triton and an 8-bit stem output"
            continue
        if kernel.startswith("int8") and not use_triton:  # its output may be fp16: the next layer's format
            rejected[name] = "needs Triton"
            continue
        try:
            with torch.inference_mode():
                if kernel.startswith("int8") and resident:  # quantized once per layout, outside the timing
                    if s.super_pixels not in pixels:
                        pixels[s.super_pixels] = s.quantize(x, net.stem_backend)
                    xin = pixels[s.super_pixels]
                else:
                    xin = x
                out = net.run_stem(xin, net.stem_backend)
                why = None if ref is None else _agree_stem(out, ref, s.out_fmt, kernel)
                ref = out if ref is None else ref
                if why is None and resident and not kernel.startswith("int8"):
                    why = "the input is int8 pixels (int8-resident): only the int8 stem reads them"
                if why is None:
                    times[name] = time_s(
                        lambda xin=xin: net.run_stem(xin, net.stem_backend), reps=5, device=device
                    )
                else:
                    rejected[name] = why
        except Exception as exc:  # noqa: BLE001 - a variant that fails is not chosen
            rejected[name] = f"{type(exc).__name__}: {exc}"[:300]
        _sync(device)
    if not times:
        raise RuntimeError(f"no stem variant works here: {rejected}")
    best = min(times, key=times.get)
    s.configure(*chosen[best])
    return {"chosen": best, "seconds": times, **({"rejected": rejected} if rejected else {})}


def _agree_stem(out: torch.Tensor, ref: torch.Tensor, fmt: str, kernel: str) -> str | None:
    """None when a stem variant's output agrees with cuDNN's (``ref``), else why."""
    if not kernel.startswith("int8"):
        return _agree(out, ref, fmt, STEM_AGREE_FRAC)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype} != {tuple(ref.shape)} {ref.dtype}"
    o, r = out.float(), ref.float()
    rel = float((o - r).norm() / r.norm().clamp_min(1e-12))
    return None if rel <= STEM_INT8_REL else f"int8 stem: relative error {rel:.3g} > {STEM_INT8_REL}"


def choose_head(net: QuantNet, batch: int, device: str, use_triton: bool) -> dict[str, Any]:
    """Set ``net.head_kernel`` to the faster of 'torch' and 'triton' at ``batch`` whose logits agree; on CUDA only.

    Returns what was timed and chosen, for ``info["head"]``. ``DEEPGAP_QUANT_HEAD=torch`` keeps torch's head
    without trying the Triton pool: a fallback, without a code change, should its first GPU run go wrong.
    """
    from deepgap.measure.quant import layers

    net.head_kernel = "torch"
    if not str(device).startswith("cuda") or not use_triton:
        return {"chosen": "torch", "reason": "not on a GPU" if use_triton else "needs Triton"}
    if switches.read("DEEPGAP_QUANT_HEAD") == "torch":  # the Triton pool not even tried (its first GPU run)
        return {"chosen": "torch", "reason": "DEEPGAP_QUANT_HEAD=torch"}
    h, w, c = net.shapes[net.head.inp]
    y = torch.randn(batch * h * w, c, device=device).clamp(min=0).to(layers.DTYPES[net.fmts[net.head.inp]])
    times: dict[str, float] = {}
    rejected: dict[str, str] = {}
    ref = None

    def check() -> str | None:  # the first kernel's logits (torch's) are the reference
        nonlocal ref
        out = net.run_head(y, batch)
        ref = out if ref is None else ref
        if torch.allclose(out, ref, rtol=1e-4, atol=1e-4):
            return None
        return f"logits differ from torch's by {float((out - ref).abs().max()):.3g}"

    with torch.inference_mode():
        for kernel in ("torch", "triton"):
            net.head_kernel = kernel
            got = checked_time(check, lambda: net.run_head(y, batch), 10, device)
            if isinstance(got, str):
                rejected[kernel] = got
            else:
                times[kernel] = got
    net.head_kernel = min(times, key=times.get) if times else "torch"
    return {"chosen": net.head_kernel, "seconds": times, **({"rejected": rejected} if rejected else {})}
