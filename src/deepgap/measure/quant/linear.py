"""An 8-bit ``nn.Linear``: fp8 (e4m3) or int8 weights per output channel, activations per row or static.

Why this module: a transformer's time is in its Linear layers (QKV, attention output, the MLP), so
the CNN engine's lesson carries over as GEMMs rather than convolutions. Hopper's fp8 and int8
tensor cores run twice the fp16 rate, and every weight is read in one byte instead of two.

- **Weights** are quantized once, per output channel (the row of ``W``): ``scale_w[n] = amax(W[n]) /
  qmax``, with ``qmax`` 448 for e4m3 and 127 for int8 (symmetric, zero point 0); or, with
  ``weight_scale="tensor"``, one scale for the whole matrix (fp8's exponent carries a channel's range).
- **Activations** (the Linear's input) are quantized on the fly, by one of two rules:
  - ``row``: per row (per token), from that row's own amax. Nothing to calibrate, and an outlier
    token spends its range on itself only. The amax is a reduction over the row, which the compiler
    fuses into the kernel that produced the row (LayerNorm, GELU, the attention output).
    Outside a compile on a GPU, ``DEEPGAP_QUANT_ROW_QUANT=triton`` quantizes the rows in one kernel
    (`deepgap.measure.quant.row_quant`: the same codes bit for bit) instead of six eager ops.
  - ``static``: one calibrated amax per Linear (`calibrate_linears`), as the CNN engine keeps one
    per tensor: no reduction at run time, but a token beyond the calibrated range is clipped.
- **The product** runs on the tensor cores: ``torch._scaled_mm`` for fp8 with both scales and the
  bias applied in its epilogue. Two scalar scales (static activations, one weight scale) take
  cuBLASLt's tensor-wise kernel; any per-row or per-channel scale takes the row-wise one (``scale_a``
  of shape (M, 1), ``scale_b`` (1, N)). ``fast_accum`` lets the fp8 kernel accumulate in the tensor
  core's own precision instead of promoting to fp32 every few K steps (TensorRT's and cuBLAS's
  fast mode). ``torch._int_mm`` runs int8 (int32 accumulator), scaled and biased afterwards. An fp8
  Linear with both scales static and per tensor may instead run deepgap's Triton fp8 GEMM with the bias
  in its epilogue (`QuantLinear.use_tile`), where the engine timed it faster than cuBLASLt at its shape
  (`deepgap.measure.quant.linear_choice`).

`QuantLinear.reference` is the exact arithmetic of both paths in fp32 (dequantize, matmul, bias); it
runs where the tensor-core kernels cannot (a CPU) and is what the tests hold the kernels to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepgap.core import switches

QMAX = {"fp8": 448.0, "int8": 127.0}
ACT_SCALES = ("row", "static")
WEIGHT_SCALES = ("channel", "tensor")
ALIGN = 16  # _scaled_mm and _int_mm need K and N in multiples of 16 (cuBLASLt's fp8 alignment)
INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA needs more than 16 rows: fewer are padded with zero rows
TINY = 1e-12  # an all-zero row gets this amax: its scale stays finite and its codes stay 0


@dataclass(frozen=True)
class LinearQuant:
    """How to quantize one Linear: precision, activation and weight scale granularity, static amax."""

    precision: str  # fp8 | int8
    act_scale: str = "row"  # row | static
    act_amax: float | None = None  # the calibrated input range; a static QuantLinear needs it
    weight_scale: str = "channel"  # channel | tensor
    fast_accum: bool = False  # fp8 only: accumulate without fp32 promotion
    # inputs of at most this many rows stay bf16 and meet the 8-bit weights in `gemv.fp8_gemv` (weight-only:
    # a decode step at a small batch is bound by reading the weights, not by the arithmetic); 0: never
    weight_only_rows: int = 0

    def __post_init__(self) -> None:
        if self.precision not in QMAX:
            raise ValueError(f"precision must be one of {sorted(QMAX)}; got {self.precision!r}")
        if self.act_scale not in ACT_SCALES:
            raise ValueError(f"act_scale must be one of {ACT_SCALES}; got {self.act_scale!r}")
        if self.weight_scale not in WEIGHT_SCALES:
            raise ValueError(f"weight_scale must be one of {WEIGHT_SCALES}; got {self.weight_scale!r}")
        if not 0 <= self.weight_only_rows <= 16:
            raise ValueError(f"weight_only_rows must be 0 to 16; got {self.weight_only_rows}")


def quantizable(linear: nn.Linear) -> bool:
    """Whether the tensor-core kernels take this Linear's shape (K and N multiples of 16)."""
    return linear.in_features % ALIGN == 0 and linear.out_features % ALIGN == 0


def quantize_codes(x: torch.Tensor, scale: torch.Tensor, precision: str) -> torch.Tensor:
    """``x / scale`` as 8-bit codes: e4m3 (round to nearest, saturated at ±448) or int8 (rounded, ±127)."""
    qmax = QMAX[precision]
    y = (x.float() / scale).clamp(-qmax, qmax)
    if precision == "fp8":
        return y.to(torch.float8_e4m3fn)
    return y.round().to(torch.int8)


def _row_kernel(x2: torch.Tensor) -> bool:
    """Whether these rows are quantized by `quant.row_quant`'s kernel rather than six torch ops.

    On a GPU, outside a compile (Inductor fuses the torch ops itself, with the norm before them), with
    ``DEEPGAP_QUANT_ROW_QUANT=triton``.
    """
    if x2.device.type != "cuda" or torch.compiler.is_compiling() or x2.stride(-1) != 1:
        return False
    return switches.read("DEEPGAP_QUANT_ROW_QUANT") == "triton"


def row_kernel_on(model: nn.Module) -> bool:
    """Whether a decoder's eager calls quantize their 8-bit inputs by `quant.row_quant`'s kernel.

    The switch is ``triton``, the model is on a GPU and holds a row-scaled `QuantLinear`: what a decode row's
    prefill label and a served decoder's ``engine_info`` name.
    """
    if switches.read("DEEPGAP_QUANT_ROW_QUANT") != "triton":
        return False
    on_gpu = model.embed_tokens.weight.device.type == "cuda"
    return on_gpu and any(isinstance(m, QuantLinear) and m.how.act_scale == "row" for m in model.modules())


def row_scales(x2: torch.Tensor, precision: str) -> torch.Tensor:
    """Per-row scales (M, 1), fp32: each row's amax over ``qmax``."""
    return x2.abs().amax(dim=1, keepdim=True).float().clamp(min=TINY) / QMAX[precision]


class QuantLinear(nn.Module):
    """A Linear whose weight is 8-bit per output channel and whose input is quantized per call."""

    def __init__(self, linear: nn.Linear, how: LinearQuant, out_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if not quantizable(linear):
            raise ValueError(
                f"Linear {linear.in_features}→{linear.out_features}: K and N must be multiples of {ALIGN}"
            )
        if how.act_scale == "static" and not (how.act_amax and how.act_amax > 0):
            raise ValueError("a static activation scale needs a calibrated amax > 0")
        self.how, self.out_dtype = how, out_dtype
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        if how.weight_scale == "channel":
            w_scale = w.abs().amax(dim=1, keepdim=True).clamp(min=TINY) / QMAX[how.precision]  # (N, 1)
        else:
            w_scale = w.abs().amax().clamp(min=TINY) / QMAX[how.precision]  # a scalar
        codes = quantize_codes(w, w_scale, how.precision)  # (N, K), row-major
        # stored as (K, N) column-major, the layout both kernels want for their second operand
        self.register_buffer("weight_t", codes.t())
        self.register_buffer("w_scale", w_scale.t().contiguous())  # (1, N) or a scalar
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(self.out_features)
        self.has_bias = linear.bias is not None
        self.register_buffer("bias", bias.to(device=w.device, dtype=out_dtype))
        amax = how.act_amax if how.act_scale == "static" else 1.0
        scale = torch.tensor(amax / QMAX[how.precision], dtype=torch.float32, device=w.device)
        self.register_buffer("act_scale", scale)
        self.fast = True  # the tensor-core kernel; False: `reference` (set by `use_reference`)
        # the input is already this layer's fp8 codes at its static scale (`deepgap.measure.quant.fused_mlp`)
        self.takes_codes = False
        self.tile: list[int] = []  # []: cuBLASLt; a TileConfig's fields: the Triton GEMM (`use_tile`)
        self.tile_scale = 1.0

    def tileable(self) -> bool:
        """Whether `use_tile` can take this Linear: fp8, static per-tensor scales, bf16 out."""
        h = self.how
        static = h.act_scale == "static" and h.weight_scale == "tensor"
        return h.precision == "fp8" and static and self.out_dtype == torch.bfloat16

    def use_tile(self, fields: list[int]) -> None:
        """Run the product through `linear_kernels.fp8_linear` at this tile (`TileConfig.fields`); [] cuBLASLt.

        Why: at some shapes (bert-base's and ViT's attention output, one H200, session 23) the persistent
        Triton GEMM with the bias in its epilogue ran faster than cuBLASLt's tensor-wise kernel.
        """
        if fields and not self.tileable():
            raise ValueError(
                "only an fp8 Linear with static per-tensor scales and bf16 out runs a Triton tile"
            )
        self.tile = list(fields)
        self.tile_scale = float(self.act_scale * self.w_scale)

    def extra_repr(self) -> str:  # noqa: D102
        return f"{self.in_features}→{self.out_features}, {self.how.precision}, activations per {self.how.act_scale}"

    def _quantize_input(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.takes_codes:
            return x2, self.act_scale
        row = self.how.act_scale == "row"
        if row and self.fast and _row_kernel(x2):  # one kernel, the same codes (`quant.row_quant`)
            from deepgap.measure.quant.row_quant import row_quant

            return row_quant(x2, self.how.precision)
        scale = row_scales(x2, self.how.precision) if row else self.act_scale  # (M, 1) or a scalar
        return quantize_codes(x2, scale, self.how.precision), scale

    def weight_only(self, x2: torch.Tensor) -> bool:
        """Whether these rows take the weight-only path (`LinearQuant.weight_only_rows`)."""
        return x2.shape[0] <= self.how.weight_only_rows and not self.takes_codes

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.weight_only(x2):
            y = self._weight_only(x2) if self.fast else self._dequantized(x2.to(torch.bfloat16), 1.0)
            return y.reshape(*lead, self.out_features)
        codes, scale = self._quantize_input(x2)
        y = self._product(codes, scale) if self.fast else self._dequantized(codes, scale)
        return y.reshape(*lead, self.out_features)

    def _product(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if self.tile:
            from deepgap.measure.quant.linear_kernels import fp8_linear_op

            w = self.weight_t.t()  # (N, K) row-major: the codes' own layout
            return fp8_linear_op(codes, w, self.bias, self.tile_scale, False, 0.0, self.tile, "none")
        if self.how.precision == "fp8":
            return self.scaled_mm(codes, scale)
        m = codes.shape[0]
        if m < INT_MM_MIN_ROWS:  # a batch-1 pooler: zero rows in, their products dropped after
            codes = torch.nn.functional.pad(codes, (0, 0, 0, INT_MM_MIN_ROWS - m))
        acc = torch._int_mm(codes, self.weight_t)[:m]  # int32 (M, N)
        return (acc.float() * scale * self.w_scale + self.bias.float()).to(self.out_dtype)

    def scaled_mm(self, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The fp8 product through cuBLASLt (``torch._scaled_mm``, bias in its epilogue), whatever `tile` says."""
        sa, sb = scale, self.w_scale
        # row-wise: both scales as vectors (repeat gives real strides, even for one row)
        if sa.dim() or sb.dim():
            sa = sa.view(1, 1).repeat(codes.shape[0], 1) if not sa.dim() else sa
            sb = sb.view(1, 1).repeat(1, self.out_features) if not sb.dim() else sb
        return torch._scaled_mm(
            codes, self.weight_t, scale_a=sa, scale_b=sb, bias=self.bias,
            out_dtype=self.out_dtype, use_fast_accum=self.how.fast_accum,
        )  # fmt: skip

    def _weight_only(self, x2: torch.Tensor) -> torch.Tensor:
        from deepgap.measure.quant.gemv import fp8_gemv_op

        y = fp8_gemv_op(x2.to(torch.bfloat16).contiguous(), self.weight_t.t(), self.channel_scales(), [])
        return (y + self.bias).to(self.out_dtype) if self.has_bias else y.to(self.out_dtype)

    def channel_scales(self) -> torch.Tensor:
        """One fp32 scale per output channel ``(N,)``, as the GEMVs take them (a view, or a copy of one scalar)."""
        return self.w_scale.reshape(-1).expand(self.out_features).contiguous()

    def _dequantized(self, codes: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
        w = self.weight_t.float() * self.w_scale  # (K, N)
        return (codes.float() * scale @ w + self.bias.float()).to(self.out_dtype)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same quantization and arithmetic in fp32 on any device: what the kernels are held to."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.weight_only(x2):  # bf16 activations as they are, the dequantized weight
            return self._dequantized(x2.to(torch.bfloat16), 1.0).reshape(*lead, self.out_features)
        codes, scale = self._quantize_input(x2)
        return self._dequantized(codes, scale).reshape(*lead, self.out_features)


def use_reference(model: nn.Module, on: bool = True) -> None:
    """Every `QuantLinear` in ``model`` computes through `QuantLinear.reference` (a CPU, or a test)."""
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.fast = not on
