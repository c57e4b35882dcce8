"""The quant network's stem: an fp16 (cuDNN) or Triton convolution whose bias, ReLU and quantization follow the pool.

Why its own module: the stem has five kernels to choose from (`stem_choice`), each with its own weights and
tile, and that choice is the stem's state; `network.QuantNet` only calls it (``run_stem``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepgap.measure.quant.fold import ConvNode
from deepgap.measure.quant.tiles import stem_tile_name


@dataclass(eq=False)
class Stem:
    """The stem: an fp16 convolution whose bias, ReLU and quantization run after the max-pool."""

    conv: ConvNode
    out: str
    out_fmt: str
    w_half: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    pad_channels: int = 0  # > 0: the image is copied into this many channels (zeros beyond 3) first
    w_pad: torch.Tensor | None = None  # w_half with zero input channels up to pad_channels
    kernel: str = "cudnn"  # 'cudnn' (+ the max-pool backend), 'fused' (`quant.stem_kernels`) or 'int8'
    super_pixels: bool = False  # the 'int8' stem on 16-byte space-to-depth pixels (`quant.stem_s2d`)
    w_gemm: torch.Tensor | None = None  # the fused kernel's [C_out, KP] weights
    fused_cfg: tuple[int, ...] = (128, 4)  # Triton stems: (pixels, warps[, persistent programs an SM])
    in_scale: float = 0.0  # the image's int8 scale (calibrated range / 127); 0: not calibrated
    w_i8: torch.Tensor | None = (
        None  # 'int8' weights: [C_out, KH·32] (`stem_int8`), [C_out, 256] (`stem_s2d`)
    )
    alpha_i8: torch.Tensor | None = None  # in_scale · s_w / s_out per channel
    pool_cfg: tuple[int, int, int, int] | None = None  # 'int8pool': `stem_pool`'s (rows, cols, warps, stages)
    swap_cfg: tuple[int, ...] | None = None  # 'int8swap': `stem_swap_pool`'s tile (`stem_swap_pool.TILES`)

    def configure(self, kernel: str, pad_channels: int = 0, fused_cfg: tuple[int, ...] | None = None) -> None:
        """Choose the convolution: ``cudnn``, ``fused``, ``int8``, ``int8s2d``, ``int8pool`` or ``int8swap``.

        ``int8`` is `quant.stem_int8` (int8 pixels and weights); it needs the image's calibrated ``in_scale``.
        ``int8s2d`` is the same on 16-byte space-to-depth pixels (`quant.stem_s2d`); ``kernel`` reads ``int8``
        and ``super_pixels`` is set.
        ``int8pool`` is the same stem with the max-pool in its kernel (`quant.stem_pool`; ``fused_cfg`` is
        then its (pooled rows, pooled columns, warps, stages)); ``kernel`` reads ``int8`` for both.
        ``int8swap`` is the super-pixel stem swapped, with the max-pool in its kernel (`quant.stem_swap_pool`;
        ``fused_cfg`` is then one of its ``TILES``); ``kernel`` reads ``int8`` and ``super_pixels`` is set.

        ``pad_channels``: cuDNN's input padded to that many channels (0: none); ``fused_cfg``: the fused
        kernel's block of output pixels and warps (None: keep the current one).
        """
        self.set_padding(pad_channels)
        self.swap_cfg = (fused_cfg or self.swap_cfg) if kernel == "int8swap" else None
        if kernel == "int8swap" and not self.swap_cfg:
            raise ValueError("the int8swap stem needs its tile (one of `stem_swap_pool.TILES`)")
        self.super_pixels = kernel in ("int8s2d", "int8swap")
        if self.super_pixels:
            kernel, fused_cfg = "int8", None if self.swap_cfg else fused_cfg
        if kernel == "int8pool":
            self.pool_cfg = fused_cfg or self.pool_cfg
            kernel, fused_cfg = "int8", (self.pool_cfg[0] * self.pool_cfg[1], self.pool_cfg[2])
        else:
            self.pool_cfg = None
        self.fused_cfg = fused_cfg or self.fused_cfg
        if kernel == "fused":
            from deepgap.measure.quant.stem_kernels import pad_weights

            self.w_gemm = pad_weights(self.w_half)
        else:
            self.w_gemm = None
        if kernel == "int8":
            from deepgap.measure.quant.stem_int8 import pack_weights

            if not self.in_scale > 0:
                raise ValueError("the int8 stem needs the image's calibrated range (recalibrate)")
            if self.super_pixels:
                from deepgap.measure.quant import stem_s2d

                w_i8, s_w = stem_s2d.pack_weights(self.conv.weight, self.conv.padding)
            else:
                w_i8, s_w = pack_weights(self.conv.weight)
            alpha = self.in_scale * s_w.double() * self.alpha.double().cpu()  # alpha = 1 / s_out
            dev = self.w_half.device
            self.w_i8, self.alpha_i8 = w_i8.to(dev), alpha.float().contiguous().to(dev)
        else:
            self.w_i8 = self.alpha_i8 = None
        self.kernel = kernel

    @property
    def variant(self) -> str:
        """The configuration's name, e.g. ``cudnn``, ``cudnn+pad4``, ``fused+128x4w``."""
        if self.pool_cfg:
            return "int8+pool{}x{}+{}w{}s".format(*self.pool_cfg)
        if self.swap_cfg:
            from deepgap.measure.quant.stem_swap_pool import tile_name

            return f"int8swap+{tile_name(self.swap_cfg)}"
        if self.kernel in ("fused", "int8"):
            return f"{self.kernel}{'s2d' * self.super_pixels}+{stem_tile_name(self.fused_cfg)}"
        return self.kernel + (f"+pad{self.pad_channels}" if self.pad_channels else "")

    def quantize(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        """A float batch → the int8 pixels this stem reads: 16-byte super pixels (`stem_s2d`) or 4-byte ones.

        The resident input (``--inputs int8-resident``) is made here, so it is always in the chosen stem's layout.
        """
        if self.super_pixels:
            from deepgap.measure.quant import stem_s2d

            return stem_s2d.quantize(x, self.in_scale, backend)
        from deepgap.measure.quant import stem_int8

        return stem_int8.quantize_image(x, self.in_scale, backend)

    @property
    def input_layout(self) -> str:
        """The layout `quantize` writes, in words (the run's ``input`` info)."""
        if self.super_pixels:
            return (
                "int8 space-to-depth pixels: 2×2 NHWC pixels of 4 bytes (3 channels and a zero) in 16 bytes"
            )
        return "int8 NHWC pixels of 4 bytes (3 channels and a zero)"

    def set_padding(self, channels: int) -> None:
        """Feed the convolution ``channels`` input channels (0: the image's own 3).

        Why: cuDNN has no tensor-core kernel for a 3-channel channels_last input; with one zero
        channel (4) it picks one. The zero channel meets zero weights, so the sums are the same.
        """
        self.pad_channels = channels
        if channels:
            w = self.w_half
            shape = (w.shape[0], channels - w.shape[1], *w.shape[2:])
            extra = torch.zeros(shape, dtype=w.dtype, device=w.device)
            self.w_pad = torch.cat([w, extra], 1).contiguous(memory_format=torch.channels_last)
        else:
            self.w_pad = None
