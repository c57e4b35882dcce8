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

``DEEPGAP_DECODE_NORM=handoff`` (`norm_mode`; ``fold`` keeps each norm in the GEMV that reads it) has the GEMV
that writes a row hand the next norm over (`deepgap.measure.quant.norm_handoff`): o's residual add also writes
x₁ ⊙ γ₂ and x₁'s square sums, which gate_up reads as a plain row; down's writes the next layer's, which its qkv
reads (a `Handed` goes from layer to layer; the first layer's qkv folds its norm).

Levers measured slower and removed (session 42; docs/llm.md keeps their measurements): the attention in the qkv
GEMV's last programs (session 24) or split in programs appended to it (session 38), every layer of the step in
one persistent kernel (session 37: 2.7× slower), and weights asked of L2 ahead of their GEMV (sessions 23, 40).
`configure` reads the switches onto the wrapped layers (at `fuse`, and again where a process times several).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from deepgap.core import switches
from deepgap.measure.quant.gemv_fused_ops import fused_gemv_op, handoff_gemv_op, rope_gemv_op
from deepgap.measure.quant.linear import QuantLinear

# DEEPGAP_DECODE_ROPE: RoPE and the cache write in `Attention.mix`, or the GEMV (mix, fused)
ROPE_MODES = switches.choices("DEEPGAP_DECODE_ROPE")


def rope_mode() -> str:
    """``DEEPGAP_DECODE_ROPE`` (`ROPE_MODES`, ``fused`` when unset); another value is a usage error."""
    return switches.read("DEEPGAP_DECODE_ROPE")


def norm_mode() -> str:
    """``DEEPGAP_DECODE_NORM``: ``handoff`` (when unset) or ``fold``; another value is a usage error."""
    return switches.read("DEEPGAP_DECODE_NORM")


class Handed(NamedTuple):
    """A fused layer's output row with the next layer's norm handed over (`norm_handoff`): the next one's input.

    ``row``: ``(1, 1, width)``, the hidden row; ``scaled``: ``(1, width)``, row ⊙ the next input norm's γ;
    ``squares``: the row's square sums.
    """

    row: torch.Tensor
    scaled: torch.Tensor
    squares: torch.Tensor

    def read(self, eps: float) -> _NormIn:
        """The next qkv GEMV's input: the scaled row, the norm's sums and eps (no γ: it is in the row)."""
        return _NormIn(self.scaled, None, eps, self.squares)


class FusedLayer(nn.Module):
    """A Llama `Layer` whose one-row calls take the fused path (module docstring).

    ``rope``: RoPE and the cache write folded into the qkv GEMV.
    """

    def __init__(self, layer: nn.Module, rope: bool = False) -> None:
        super().__init__()
        self.layer = layer
        self.rope = rope
        self.handoff = False  # o's GEMV hands the post-attention norm to gate_up's (``DEEPGAP_DECODE_NORM``)
        # with it, the next layer's input norm, which down's GEMV hands over: in a tuple, kept out of the
        # module tree (its weight is the next layer's)
        self.next_norm: tuple[nn.Module, ...] = ()

    def takes_fused(self, x) -> bool:
        """Whether a call on ``x (b, s, width)`` takes the fused path: one row, every projection's fast GEMV."""
        b, s, width = x.shape
        return b * s == 1 and all(
            p.weight_only(x.reshape(1, width)) and p.fast for p in _projections(self.layer)
        )

    def forward(self, x, cos, sin, cache, pos):
        """The next hidden row ``x``'s shape; a `Handed` one where the next layer takes the norm (``next_norm``).

        ``x`` may be the previous layer's `Handed`: its row, whose norm the qkv GEMV then reads handed over.
        """
        handed = x if isinstance(x, Handed) else None
        x = x.row if handed is not None else x
        lay = self.layer
        b, s, width = x.shape
        if not self.takes_fused(x):
            return lay(x, cos, sin, cache, pos)
        attn = lay.self_attn
        n1, n2 = lay.input_layernorm, lay.post_attention_layernorm
        h = x.reshape(1, width).contiguous()
        qkv_in = _NormIn(h, n1.weight, n1.eps) if handed is None else handed.read(n1.eps)
        if self.rope and cache is not None and isinstance(pos, (int, torch.Tensor)):
            a = _rope_attention(attn, qkv_in, (cos, sin), cache, pos)
        else:
            qkv = _gemv(attn.qkv_proj, qkv_in)
            a = attn.mix(qkv, 1, 1, cos, sin, cache, pos).reshape(1, -1).contiguous()
        if self.handoff:
            x1, scaled, squares = _handoff(attn.o_proj, a, h, n2.weight)
            mid = _gemv(lay.gate_up_proj, Handed(x1, scaled, squares).read(n2.eps), swiglu=True)
        else:
            x1 = _gemv(attn.o_proj, _NormIn(a), residual=h)
            mid = _gemv(lay.gate_up_proj, _NormIn(x1, n2.weight, n2.eps), swiglu=True)
        if self.next_norm:
            row, scaled, squares = _handoff(lay.down_proj, mid, x1, self.next_norm[0].weight)
            return Handed(row.reshape(b, s, width), scaled, squares)
        return _gemv(lay.down_proj, _NormIn(mid), residual=x1).reshape(b, s, width)


class _NormIn(NamedTuple):
    """A GEMV's input row and its norm: folded (``gamma``), handed over (``squares``: x is the row ⊙ γ) or none."""

    x: torch.Tensor
    gamma: torch.Tensor | None = None
    eps: float = 0.0
    squares: torch.Tensor | None = None


def _projections(layer: nn.Module) -> tuple[QuantLinear, ...]:
    a = layer.self_attn
    return (a.qkv_proj, a.o_proj, layer.gate_up_proj, layer.down_proj)


def _rope_attention(attn: nn.Module, row: _NormIn, angles, cache, pos):
    """The attention row of a step whose qkv GEMV does RoPE and writes k and v into the cache.

    A one-sequence step at one position (an int, eager, or a device tensor); the row ``(1, heads · head_dim)``,
    attended over the written positions.
    """
    at = pos  # eager's int as the device tensor the kernel reads
    if not isinstance(pos, torch.Tensor):
        at = torch.full((1,), pos, dtype=torch.int64, device=row.x.device)
    p = attn.qkv_proj
    gemv = (row.x, p.weight_t.t(), p.channel_scales(), row.gamma, row.eps)
    args = (*gemv, *angles, at, cache.k, cache.v, attn.nq)
    q = rope_gemv_op(*args, row.squares).view(1, attn.nq, 1, attn.d)
    return cache.attend_written(q, pos).reshape(1, -1).contiguous()


def _gemv(p: QuantLinear, row: _NormIn, residual=None, swiglu: bool = False):
    s = p.channel_scales()
    return fused_gemv_op(row.x, p.weight_t.t(), s, row.gamma, residual, row.eps, swiglu, row.squares)


def _handoff(p: QuantLinear, x, residual, gamma):
    """``residual + x · Wᵀ`` with the next norm (``gamma``) handed over: the row, row ⊙ γ, its square sums."""
    return handoff_gemv_op(x, p.weight_t.t(), p.channel_scales(), residual, gamma)


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
    """``DEEPGAP_DECODE_ROPE``, ``_NORM`` and ``_ANGLES`` read onto ``model``'s fused layers.

    Called by `fuse`, and again by a process that times several switches on one model (the bare loop); a
    compiled step sees the change as a new attribute value (a recompile).
    """
    from deepgap.measure.llm_angles import angles_mode, rope_angles

    rope, handoff = rope_mode() == "fused", norm_mode() == "handoff"
    layers = list(getattr(model, "layers", ()))
    # the angles every fused qkv GEMV reads: one kernel's where the switch asks (`llm_angles` says why)
    if any(isinstance(layer, FusedLayer) for layer in layers):
        model.angle_fn = rope_angles if rope and angles_mode() == "kernel" else None
    for layer, after in zip(layers, [*layers[1:], None], strict=True):
        if isinstance(layer, FusedLayer):
            layer.rope, layer.handoff = rope, handoff
            # down hands the next layer's norm over to a qkv GEMV of its own
            chained = handoff and isinstance(after, FusedLayer)
            layer.next_norm = (after.layer.input_layernorm,) if chained else ()
