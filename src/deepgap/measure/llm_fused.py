"""The quant engine's batch-1 decode layer: four fused GEMVs around the attention instead of ten kernels.

Why: at batch 1 the 8-bit decoder's step is bound by reading its weights, but between the four weight-only
GEMVs of each layer ran the two RMSNorms, the two residual adds and SiLU × up as kernels of their own
(results/h200/session18: 0.40 of 3.25 ms per token). `FusedLayer` runs a one-row step as

    qkv  = GEMV(norm₁(x))                      the norm folded in (`gemv_fused`)
    a    = attention(RoPE(q, k), cache)       as the plain layer (`Attention.mix`)
    x₁   = x + GEMV(a)                         the residual folded in
    h    = silu(gate) · up of GEMV(norm₂(x₁))  norm and SwiGLU folded in
    out  = x₁ + GEMV(h)                        the residual folded in

and every other call (the prefill, batches over one row, a CPU reference run) through the plain layer it
wraps, so both read the same weights. `fuse` wraps a decoder's layers where every projection is a
weight-only `QuantLinear` without bias; elsewhere it changes nothing.

``DEEPGAP_DECODE_ROPE=fused`` (read when `fuse` wraps; the default, ``mix`` the plain path) folds RoPE and the
K/V cache write into the qkv GEMV as well (`gemv_fused.RopeWrite`): it returns the rotated q and writes the
rotated k and the plain v into the static cache at the step's device position, and the attention reads the
cache as written (`attend_written`), without `Attention.mix`'s three small kernels a layer (session 21:
~0.12 of 2.675 ms per 8B token). On one H200 (session 22, bare loop, PDL and split KV): 374.8 → 389.1 tok/s.

``DEEPGAP_DECODE_ATTENTION=qkv`` (`llm_attention.attention_mode`; off by default: timed slower, session 24) goes one
step further with RoPE fused: at a device-side position the qkv GEMV's last programs attend too
(`deepgap.measure.llm_qkv_attention`) and return the attention's row, the attention and combine kernels gone.
``DEEPGAP_DECODE_WHOLE=on|l2|ahead`` (`llm_whole_plan`; off by default: timed 2.7× slower, session 37) runs
every layer of such a step in one persistent kernel instead (`deepgap.measure.llm_whole`), where all of a
decoder's layers are fused with RoPE.
`configure` reads the switches onto the wrapped layers and the model (at `fuse`, and again where a process times
several).
"""

from __future__ import annotations

import torch
from torch import nn

from deepgap.core import switches
from deepgap.measure import llm_whole_plan
from deepgap.measure.llm_attention import attention_mode
from deepgap.measure.llm_qkv_attention import rope_gemv_attend_op
from deepgap.measure.llm_qkv_split import rope_gemv_attend_split_op
from deepgap.measure.quant.gemv_fused import fused_gemv_op, rope_gemv_op
from deepgap.measure.quant.linear import QuantLinear

# DEEPGAP_DECODE_ROPE: RoPE and the cache write in `Attention.mix`, or the GEMV (mix, fused)
ROPE_MODES = switches.choices("DEEPGAP_DECODE_ROPE")


def rope_mode() -> str:
    """``DEEPGAP_DECODE_ROPE`` (`ROPE_MODES`, ``fused`` when unset); another value is a usage error."""
    return switches.read("DEEPGAP_DECODE_ROPE")


class FusedLayer(nn.Module):
    """A Llama `Layer` whose one-row calls take the fused path (module docstring).

    ``rope``: RoPE and the cache write folded into the qkv GEMV; ``attend``: with ``rope``, at a device-side
    position the attention too (`attends_in_qkv`): ``qkv`` in one program per KV head, ``qkv-split`` split over
    the cache (`deepgap.measure.llm_qkv_split`); empty: the attention kernel.
    """

    def __init__(self, layer: nn.Module, rope: bool = False, attend: str = "") -> None:
        super().__init__()
        self.layer = layer
        self.rope = rope
        self.attend = attend

    @property
    def attends_in_qkv(self) -> bool:
        """Whether a one-sequence static step's attention is done by the qkv GEMV (`llm_attention.describe`)."""
        return self.rope and bool(self.attend)

    def takes_fused(self, x) -> bool:
        """Whether a call on ``x (b, s, width)`` takes the fused path: one row, every projection's fast GEMV."""
        b, s, width = x.shape
        return b * s == 1 and all(
            p.weight_only(x.reshape(1, width)) and p.fast for p in _projections(self.layer)
        )

    def forward(self, x, cos, sin, cache, pos):  # noqa: D102
        lay = self.layer
        b, s, width = x.shape
        if not self.takes_fused(x):
            return lay(x, cos, sin, cache, pos)
        attn = lay.self_attn
        n1, n2 = lay.input_layernorm, lay.post_attention_layernorm
        h = x.reshape(1, width).contiguous()
        if self.rope and cache is not None and isinstance(pos, (int, torch.Tensor)):
            a = _rope_attention(attn, h, n1, (cos, sin), cache, pos, self.attend)
        else:
            qkv = _gemv(attn.qkv_proj, h, gamma=n1.weight, eps=n1.eps)
            a = attn.mix(qkv, 1, 1, cos, sin, cache, pos).reshape(1, -1).contiguous()
        x1 = _gemv(attn.o_proj, a, residual=h)
        mid = _gemv(lay.gate_up_proj, x1, gamma=n2.weight, eps=n2.eps, swiglu=True)
        return _gemv(lay.down_proj, mid, residual=x1).reshape(b, s, width)


def _projections(layer: nn.Module) -> tuple[QuantLinear, ...]:
    a = layer.self_attn
    return (a.qkv_proj, a.o_proj, layer.gate_up_proj, layer.down_proj)


def _rope_attention(attn: nn.Module, h, norm: nn.Module, angles, cache, pos, attend: str):
    """The attention row of a step whose qkv GEMV does RoPE and writes k and v into the cache (then attends).

    A one-sequence step at one position (an int, eager, or a device tensor); the row ``(1, heads · head_dim)``.
    ``attend`` (`FusedLayer`): at a device-side position the GEMV's last programs attend (`rope_gemv_attend_op`,
    or `rope_gemv_attend_split_op` for ``qkv-split``); an int position (eager, the reference) keeps the attention
    over the written positions.
    """
    at = pos  # eager's int as the device tensor the kernel reads
    if not isinstance(pos, torch.Tensor):
        at = torch.full((1,), pos, dtype=torch.int64, device=h.device)
    p = attn.qkv_proj
    gemv = (h, p.weight_t.t(), p.channel_scales(), norm.weight, norm.eps)
    args = (*gemv, *angles, at, cache.k, cache.v, attn.nq)
    if attend and isinstance(pos, torch.Tensor):
        return (rope_gemv_attend_split_op if attend == "qkv-split" else rope_gemv_attend_op)(*args)
    q = rope_gemv_op(*args)
    return cache.attend_written(q.view(1, attn.nq, 1, attn.d), pos).reshape(1, -1).contiguous()


def _gemv(p: QuantLinear, x, gamma=None, eps: float = 0.0, residual=None, swiglu: bool = False):
    return fused_gemv_op(x, p.weight_t.t(), p.channel_scales(), gamma, residual, eps, swiglu)


def fusable(layer: nn.Module) -> bool:
    """Whether ``layer`` is a Llama layer whose four projections are weight-only 8-bit Linears without bias."""
    try:
        projections = _projections(layer)
    except AttributeError:
        return False
    return all(
        isinstance(p, QuantLinear) and p.how.weight_only_rows >= 1 and not p.has_bias for p in projections
    )


def fuse(model: nn.Module) -> int:
    """Wrap each fusable layer of ``model.layers`` in a `FusedLayer`; the number wrapped."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        return 0
    done = 0
    for i, layer in enumerate(layers):
        if fusable(layer):
            layers[i] = FusedLayer(layer)
            done += 1
    configure(model)
    return done


def configure(model: nn.Module) -> None:
    """``DEEPGAP_DECODE_ROPE`` and ``DEEPGAP_DECODE_ATTENTION`` read onto ``model``'s fused layers.

    Called by `fuse`, and again by a process that times several switches on one model (the bare loop); a
    compiled step sees the change as a new attribute value (a recompile).
    """
    rope, attend = rope_mode() == "fused", attention_mode()
    attend = attend if attend in ("qkv", "qkv-split") else ""
    layers = list(getattr(model, "layers", ()))
    for layer in layers:
        if isinstance(layer, FusedLayer):
            layer.rope, layer.attend = rope, attend
    whole = llm_whole_plan.mode()
    if hasattr(model, "whole_step"):
        fused = bool(layers) and all(isinstance(layer, FusedLayer) for layer in layers)
        take = whole != "off" and rope and not attend and fused
        model.whole_step = llm_whole_plan.WholeStep(model, llm_whole_plan.tiles_for(whole)) if take else None
