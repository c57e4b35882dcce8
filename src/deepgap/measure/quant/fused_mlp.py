"""A transformer MLP's first fp8 Linear, its GELU and the second Linear's input quantization in one kernel.

Why: in the quant engine's transformer path the first MLP Linear writes bf16 and a separate kernel
applies GELU and quantizes for the second Linear: 2.5 of 9.7 ms per batch in bert-base fp8 on one H200
(results/h200/session17). `fuse_mlp` rewrites each chain ``Linear → GELU → Linear`` whose Linears are
fp8 `QuantLinear`s with static per-tensor scales: the first becomes `FusedLinearGelu` (one Triton kernel,
`deepgap.measure.quant.linear_kernels.fp8_linear`, writing the second Linear's fp8 codes), the GELU an
identity, and the second Linear takes those codes as they are.

A chain is found where the model says where it is (a module's ``mlp_chain`` attribute names its three
children, as BERT's layer does) or where an ``nn.Sequential`` holds Linear, GELU, any dropouts, Linear
(torchvision's ViT MLP block); nothing else is rewritten. The kernel is a torch custom op
(`linear_kernels.fp8_linear_op`), so torch.compile keeps it as one call and the CUDA graph captures it.
Its tile chooses the GEMM core: the grouped kernel (`FP8_LINEAR_TILE`, the default) or the persistent TMA
one (a ``persistent`` tile, e.g. `FP8_LINEAR_PERSISTENT_TILE`; Hopper), with the same epilogue.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from deepgap.measure.quant.linear import QuantLinear, quantize_codes
from deepgap.measure.quant.linear_kernels import FP8_LINEAR_TILE, fp8_linear_op
from deepgap.measure.quant.tiles import TileConfig


def _fusable(first, act, second) -> bool:
    def static_fp8(m) -> bool:
        h = getattr(m, "how", None)
        return (
            isinstance(m, QuantLinear)
            and h.precision == "fp8"
            and h.act_scale == "static"
            and h.weight_scale == "tensor"
        )

    gelu = isinstance(act, nn.GELU) and act.approximate in ("none", "tanh")
    return static_fp8(first) and static_fp8(second) and gelu


class FusedLinearGelu(nn.Module):
    """``q(gelu(first(x)))`` at ``second``'s input scale: fp8 codes for ``second`` to take as they are.

    ``approximate``: the GELU's form (`linear_kernels.APPROXIMATE`); "none" is the exact one.
    """

    def __init__(
        self, first: QuantLinear, second: QuantLinear, tile: TileConfig | None, approximate: str = "none"
    ) -> None:
        super().__init__()
        self.approximate = approximate
        self.in_features, self.out_features = first.in_features, first.out_features
        self.register_buffer("act_scale", first.act_scale)
        self.register_buffer("weight", first.weight_t.t())  # (N, K) row-major: W's own layout
        self.register_buffer("bias", first.bias.float())
        self.scale = float(first.act_scale * first.w_scale)
        self.out_scale = float(second.act_scale)
        self.tile = tile.fit(self.in_features, self.out_features).fields() if tile else []  # []: tuned

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        lead = x.shape[:-1]
        codes = quantize_codes(x.reshape(-1, self.in_features), self.act_scale, "fp8")
        y = fp8_linear_op(
            codes, self.weight, self.bias, self.scale, True, self.out_scale, self.tile, self.approximate
        )
        return y.reshape(*lead, self.out_features)


def _chains(model: nn.Module):
    """(parent, first name, act name, second name) of every MLP chain the model marks or holds in order."""
    for parent in model.modules():
        names = getattr(parent, "mlp_chain", None)
        if names:
            yield parent, *names
        elif isinstance(parent, nn.Sequential):
            kids = list(parent.named_children())
            for i, (name, _) in enumerate(kids[:-2]):
                if isinstance(kids[i + 1][1], nn.GELU):
                    rest = [(n, c) for n, c in kids[i + 2 :] if not isinstance(c, nn.Dropout)]
                    if rest:
                        yield parent, name, kids[i + 1][0], rest[0][0]


def fuse_mlp(
    model: nn.Module, tile: TileConfig | Literal["tuned"] | None = None, approximate: str = "none"
) -> int:
    """Rewrite every fusable MLP chain of a quantized ``model`` (module doc); returns how many.

    ``tile``: the kernel's tile, fitted to each Linear; a ``persistent`` one (`tiles.linear_persistent_configs`)
    runs the persistent TMA kernel, any other the grouped one (default `FP8_LINEAR_TILE`); "tuned": each
    shape's fastest of both kernels' tiles, timed on its first call (`linear_kernels.tuned`) or, in the
    engine, in one eager pass before compiling (`linear_choice.choose_kernels`). ``approximate``: "tanh"
    runs GELU's tanh form (the quant engine's default, `linear_choice.DEFAULT_GELU`; BERT and ViT specify
    the exact one, "none"), "erf-poly" the exact
    one with a branch-free erf (`linear_kernels.APPROXIMATE`); a model whose own GELU is the tanh form
    keeps it whatever is asked.
    """
    done = 0
    for parent, first, act, second in list(_chains(model)):
        f, a, s = (getattr(parent, n) for n in (first, act, second))
        if not _fusable(f, a, s):
            continue
        form = "tanh" if a.approximate == "tanh" else approximate
        chosen = None if tile == "tuned" else tile or FP8_LINEAR_TILE
        setattr(parent, first, FusedLinearGelu(f, s, chosen, form))
        setattr(parent, act, nn.Identity())
        s.takes_codes = True
        done += 1
    return done
