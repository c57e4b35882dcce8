"""A transformer's Linear layers in fp8 or int8: attention unfused, ranges calibrated, Linears swapped.

The quant engine's path for text encoders (BERT) and vision transformers (ViT): every Linear whose
shape the tensor cores take becomes a `deepgap.measure.quant.linear.QuantLinear`; attention itself
stays in bf16 through SDPA's fused kernels (its two products are 3–8% of BERT's FLOPs at sequence
128–384); LayerNorm, GELU, the embeddings and any Linear the kernels cannot take (ViT's 1000-class
head: N is not a multiple of 16) stay bf16. The compiler then fuses each activation's quantization
into the kernel that produced it, and the whole network is captured as one CUDA graph
(`deepgap.measure.quant.transformer_engine`).

torchvision's ViT runs attention as ``nn.MultiheadAttention``, whose projections are not called as
Linear modules (its fused path reads ``in_proj_weight`` directly):
`deepgap.measure.models.attention.unfuse_attention` first makes them plain Linears around one SDPA call.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from deepgap.measure.models.build import hooks_installed
from deepgap.measure.quant.calibrate import _stat
from deepgap.measure.quant.linear import LinearQuant, QuantLinear, quantizable


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the Linears the tensor cores take, in module order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and quantizable(m)]


def calibrate_linears(
    model: nn.Module, batches: list[torch.Tensor], method: str = "p99.99"
) -> dict[str, float]:
    """Each quantizable Linear's input range over ``batches`` (fp32 model, TF32 off): {name: amax}.

    ``method`` as in `deepgap.measure.quant.calibrate`: 'max' or a percentile 'pNN.NN' per batch, then
    the largest over batches. A model set to a mixed-length batch (``text_batch``, `deepgap.measure.models.text_batch`)
    is calibrated on full sequences, as every text model is: its layout holds the timed batch's shape, not the
    calibration batches', and is set again afterwards.
    """
    batch = getattr(model, "text_batch", None)
    if batch is not None:
        model.set_text_batch(None)
        try:
            return calibrate_linears(model, batches, method)
        finally:
            model.set_text_batch(batch)
    names = set(linear_names(model))
    amax: dict[str, float] = {}
    hooks = []
    for name, m in model.named_modules():
        if name in names:

            def observe(_m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), _stat(args[0], method))

            hooks.append(m.register_forward_pre_hook(observe))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with hooks_installed(hooks), torch.inference_mode():
            for x in batches:
                model(x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return {k: (v if v > 0 else 1e-8) for k, v in amax.items()}


def quantize_linears(
    model: nn.Module,
    how: LinearQuant,
    amax: dict[str, float] | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> list[str]:
    """Swap every quantizable Linear of ``model`` (fp32) for a `QuantLinear` made as ``how`` says.

    Returns the swapped names. ``amax`` (from `calibrate_linears`) gives each Linear's static activation
    range when ``how.act_scale`` is "static" (``how.act_amax`` is then ignored). Then the float parts left
    (norms, embeddings, the Linears the kernels cannot take) are cast to ``out_dtype``; the 8-bit
    codes and fp32 scales of the swapped layers keep their types.
    """
    names = linear_names(model)
    static = how.act_scale == "static"
    if static and not amax:
        raise ValueError("static activation scales need calibrated ranges (calibrate_linears)")
    modules = dict(model.named_modules())
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        layer_how = replace(how, act_amax=amax[name]) if static else how
        setattr(parent, attr, QuantLinear(modules[name], layer_how, out_dtype))
    cast_float_parts(model, out_dtype)
    return names


def cast_float_parts(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast the floating parameters and buffers of every module but the `QuantLinear`s to ``dtype``.

    ``Module.to(dtype)`` would cast an fp8 weight and the fp32 scales too (fp8 counts as floating).
    """
    for m in model.modules():
        if isinstance(m, QuantLinear):
            continue
        for key, p in m.named_parameters(recurse=False):
            if p.is_floating_point():
                setattr(m, key, nn.Parameter(p.detach().to(dtype), requires_grad=False))
        for key, b in m.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                setattr(m, key, b.to(dtype))
