"""Quantized layers: weight quantization, epilogue coefficients, exact references and the torch path.

Scheme (symmetric, no zero points, so the GEMM is a plain int8·int8→int32 or fp8·fp8→fp32 product):
  weights      per output channel:  s_w[n] = max|W[n]| / Q,   W_q = round(W / s_w)
  activations  per tensor, static:  s_x = amax_x / Q  (amax from calibration),  x_q = quant(x / s_x)
  Q = 127 (int8) or 448 (fp8 e4m3).
A layer with input scale s_x, residual scale s_r and output scale s_y (1 for fp16 tensors) computes
    y_q = act(acc·(s_x·s_w[n]/s_y) + b[n]/s_y + res_q·(s_r/s_y))  =  act(acc·α[n] + β[n] + γ·res_q)
ReLU commutes with the positive division by s_y, so it is applied to the scaled value.

``conv_reference`` is the exact emulation used to check kernels: the integer (or fp8) accumulation
is computed in float64 — exact, since int8 sums stay far below 2^53 and fp8 products span < 53 bits —
then rounded to fp32 like the GPU's int32→fp32 conversion, and the epilogue repeats the kernel's
fp32 operations one by one. ``conv_torch`` is the slower fallback that needs no Triton
(im2col + ``torch._int_mm`` / ``torch._scaled_mm``, epilogue in torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:
    from deepgap.measure.quant.fold import ConvNode

QMAX = {"int8": 127.0, "fp8": 448.0}
DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "fp16": torch.float16}
QFORMATS = tuple(QMAX)


def quantize_weight(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric quantization of fp32 conv weights [Cout, Cin, k, k].

    Returns:
        (w_q [Cout, k·k·Cin] in (kh, kw, c) order — the GEMM's K-major B —, scales fp32 [Cout]).
    """
    qmax = QMAX[fmt]
    w64 = w.detach().double()
    amax = w64.abs().amax(dim=(1, 2, 3)).clamp_min(1e-12)
    scale = amax / qmax
    v = w64 / scale.view(-1, 1, 1, 1)
    if fmt == "int8":
        wq = v.round().clamp(-qmax, qmax).to(torch.int8)
    else:
        wq = v.clamp(-qmax, qmax).float().to(torch.float8_e4m3fn)
    wq = wq.permute(0, 2, 3, 1).reshape(w.shape[0], -1).contiguous()
    return wq, scale.float()


def weight_as_conv(wq: torch.Tensor, cin: int, k: int) -> torch.Tensor:
    """[Cout, k·k·Cin] (kh, kw, c) → [Cout, Cin, k, k] (same dtype), for ``F.conv2d``."""
    return wq.view(wq.shape[0], k, k, cin).permute(0, 3, 1, 2)


def quantize_act(y: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round an already-scaled fp32 tensor to ``fmt`` exactly as the kernels do."""
    if fmt == "int8":
        return y.clamp(-127.0, 127.0).round().to(torch.int8)  # round half to even, like the kernels
    if fmt == "fp8":
        return y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if fmt == "fp16":
        return y.to(torch.float16)
    raise ValueError(f"unknown activation format {fmt!r}")


def epilogue_reference(acc32, alpha, beta, out_fmt, relu, res=None, gamma=0.0):
    """The kernels' epilogue in torch, op by op in fp32 (``acc32`` [M, N] fp32)."""
    y = acc32 * alpha.to(acc32.device)
    y = y + beta.to(acc32.device)
    if res is not None:
        y = y + res.float() * torch.tensor(gamma, dtype=torch.float32, device=acc32.device)
    if relu:
        y = torch.clamp_min(y, 0.0)
    return quantize_act(y, out_fmt)


def f32(v: float) -> float:
    """``v`` rounded to fp32 (the value a Triton float argument carries)."""
    return float(torch.tensor(v, dtype=torch.float32))


@dataclass(eq=False)
class QConv:
    """One convolution ready to run: mode 'q' (int8/fp8 GEMM) or 'fp16' (cuDNN), with its coefficients."""

    node: ConvNode
    qfmt: str  # the precision's quantized format: 'int8' or 'fp8'
    mode: str  # 'q' or 'fp16'
    in_fmt: str
    out_fmt: str
    res_fmt: str | None
    in_scale: float
    out_scale: float
    res_scale: float
    w_q: torch.Tensor  # [Cout, k·k·Cin]
    w_scale: torch.Tensor  # fp32 [Cout]
    w_half: torch.Tensor  # fp16 [Cout, Cin, k, k]
    alpha: torch.Tensor  # fp32 [Cout]
    beta: torch.Tensor  # fp32 [Cout]
    gamma: float

    @property
    def name(self) -> str:
        """The node's name."""
        return self.node.name

    def to(self, device) -> QConv:
        """Move the tensors (weights, coefficients) to ``device`` in place; returns self."""
        for f in ("w_q", "w_scale", "alpha", "beta"):
            setattr(self, f, getattr(self, f).to(device))
        self.w_half = self.w_half.to(device).contiguous(memory_format=torch.channels_last)
        return self


def make_qconv(node: ConvNode, qfmt: str, mode: str, fmts: dict[str, str], scales: dict[str, float]) -> QConv:
    """Quantize ``node``'s weights and compute α, β, γ for the given tensor formats and scales.

    ``fmts[t]`` is the storage format of tensor t; ``scales[t]`` its quantization scale (ignored for fp16).
    """
    if qfmt not in QMAX:
        raise ValueError(f"qfmt must be one of {QFORMATS}; got {qfmt!r}")
    if mode not in ("q", "fp16"):
        raise ValueError(f"mode must be 'q' or 'fp16'; got {mode!r}")

    def scale(t: str) -> float:
        return 1.0 if fmts[t] == "fp16" else float(scales[t])

    in_fmt, out_fmt = fmts[node.inp], fmts[node.out]
    want_in = qfmt if mode == "q" else "fp16"
    if in_fmt != want_in:
        raise ValueError(f"{node.name}: mode {mode} needs a {want_in} input; tensor {node.inp} is {in_fmt}")
    s_in, s_out = scale(node.inp), scale(node.out)
    res_fmt = fmts[node.residual] if node.residual else None
    s_res = scale(node.residual) if node.residual else 0.0
    wq, ws = quantize_weight(node.weight, qfmt)
    alpha = (  # quantized: per-channel weight scale; fp16 path: the output's requantization only
        ws.double() * s_in / s_out
        if mode == "q"
        else torch.full((node.cout,), 1.0 / s_out, dtype=torch.float64)
    )
    beta = node.bias.double() / s_out
    return QConv(
        node=node,
        qfmt=qfmt,
        mode=mode,
        in_fmt=in_fmt,
        out_fmt=out_fmt,
        res_fmt=res_fmt,
        in_scale=s_in,
        out_scale=s_out,
        res_scale=s_res,
        w_q=wq,
        w_scale=ws,
        w_half=node.weight.half(),
        alpha=alpha.float().contiguous(),
        beta=beta.float().contiguous(),
        gamma=f32(s_res / s_out),
    )


def _nchw(x2d: torch.Tensor, nhw: tuple[int, int, int]) -> torch.Tensor:
    nb, h, w = nhw
    return x2d.view(nb, h, w, -1).permute(0, 3, 1, 2)


def _flat(y4: torch.Tensor) -> torch.Tensor:
    return y4.permute(0, 2, 3, 1).reshape(-1, y4.shape[1])


def conv_reference(layer: QConv, x: torch.Tensor, nhw, res=None) -> torch.Tensor:
    """Exact emulation of the layer (any device): x [nb·h·w, C] in ``layer.in_fmt`` → [M, Cout]."""
    n = layer.node
    if layer.mode == "q":
        w = weight_as_conv(layer.w_q, n.cin, n.kernel_size).to(x.device).double()
        acc = F.conv2d(_nchw(x, nhw).double(), w, None, n.stride, n.padding).float()
    else:  # cuDNN fp16: fp32 accumulation, fp16 output
        w = layer.w_half.to(x.device).double()
        acc = F.conv2d(_nchw(x, nhw).double(), w, None, n.stride, n.padding).half().float()
    return epilogue_reference(_flat(acc), layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma)


def im2col(x: torch.Tensor, nhw, k: int, stride: int, padding: int) -> torch.Tensor:
    """NHWC [nb·h·w, C] → patches [nb·oh·ow, k·k·C] in (kh, kw, c) order (any dtype, any device)."""
    nb, h, w = nhw
    c = x.shape[1]
    x4 = x.view(nb, h, w, c)
    if k == 1 and padding == 0:
        return x4[:, ::stride, ::stride].reshape(-1, c)
    hp, wp = h + 2 * padding, w + 2 * padding
    xp = torch.zeros((nb, hp, wp, c), dtype=x.dtype, device=x.device)
    xp[:, padding : padding + h, padding : padding + w] = x4
    oh, ow = (hp - k) // stride + 1, (wp - k) // stride + 1
    sn, sh, sw, sc = xp.stride()
    patches = xp.as_strided((nb, oh, ow, k, k, c), (sn, stride * sh, stride * sw, sh, sw, sc))
    return patches.reshape(nb * oh * ow, k * k * c)


def gemm_torch(a: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """acc[M, N] fp32 = a[M, K] · wq[N, K]ᵀ through ``torch._int_mm`` (int8) or ``torch._scaled_mm`` (fp8).

    Rows are padded with zeros where the library wants it (``_int_mm``: M > 16; fp8: M a multiple of 16).
    """
    m = a.shape[0]
    target = max(17, m) if a.dtype == torch.int8 else -(-m // 16) * 16
    if target > m:
        a = torch.cat([a, torch.zeros((target - m, a.shape[1]), dtype=a.dtype, device=a.device)])
    if a.dtype == torch.int8:
        # B column-major (wq's own layout, transposed view): cuBLAS's int8 GEMM may refuse a
        # row-major B at large M (CUBLAS_STATUS_NOT_SUPPORTED); docs/quant.md says where.
        acc = torch._int_mm(a, wq.t()).float()
    else:
        one = torch.ones((), dtype=torch.float32, device=a.device)
        try:
            acc = torch._scaled_mm(a, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        except RuntimeError:  # builds whose fp8 GEMM only writes 16-bit outputs
            acc = torch._scaled_mm(a, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16).float()
    return acc[:m]


def conv_torch(layer: QConv, x: torch.Tensor, nhw, res=None) -> torch.Tensor:
    """The layer through torch ops only: im2col + ``_int_mm``/``_scaled_mm`` (q mode) or cuDNN (fp16)."""
    n = layer.node
    if layer.mode == "q":
        acc = gemm_torch(im2col(x, nhw, n.kernel_size, n.stride, n.padding), layer.w_q)
    else:
        acc = _flat(F.conv2d(_nchw(x, nhw), layer.w_half, None, n.stride, n.padding)).float()
    return epilogue_reference(acc, layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma)
