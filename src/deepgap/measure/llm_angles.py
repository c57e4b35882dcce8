"""RoPE's angles for a decode step in one kernel: each position's cos and sin, one buffer that every layer reads.

Why: at batch 1 the fused qkv GEMV (`quant.gemv_fused_ops.rope_gemv`) takes the step's cos and sin, a custom op
in each of the 32 layers. Inductor hands a custom op a buffer of its own for an input that is a cheap pointwise
result (``cos(pos · inv_freq)``): it copies the value into a new buffer per consumer, recomputing it in each
copy, so the 8B step began with about ten small kernels writing 64 copies of two 128-value rows, about 15 µs a
step on one H100's timeline (session 52, `results/h100/session52/timeline-bs1-5.csv`; the CPU's generated code
shows the same). Computed by this op instead, the angles are one extern kernel's outputs, which every consumer
reads as they are.

``DEEPGAP_DECODE_ANGLES`` (`angles_mode`): ``kernel`` (the default since session 53) or ``inductor``. On one H200
(results/h200/session53, 8B fp8, batch 1, bare loop) the kernel took the step from 2.3463 to 2.3225 ms (426.2 →
430.6 tokens/s), and on its timeline the ten angle kernels (14 µs of the critical path a step) became one (1.7 µs).
`deepgap.measure.llm_fused.configure` sets it on a fused decoder; `Llama.angles` asks `rope_angles`.

The arithmetic is the model's own (HF's order): the position in fp32 times each inverse frequency in fp32,
the row ``[f, f]``, cos and sin in fp32, each cast to the model's dtype, by the same ``tl.cos`` and ``tl.sin``
that Inductor's generated Triton code calls (``tl_math``), so on a GPU these are the default path's angles. On
CPU tensors the kernel runs in Triton's interpreter (numpy's cos and sin, which may part from torch's by one
fp32 ulp), as the tests do through `compute`; the op itself runs `reference`, the torch formula, on CPU tensors.
"""

# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepgap.core import switches
from deepgap.measure.models.llama_net import angles_formula
from deepgap.measure.quant.gdc import pdl_enter
from deepgap.measure.quant.launch import launcher

ANGLE_MODES = switches.choices("DEEPGAP_DECODE_ANGLES")  # inductor, kernel


def angles_mode() -> str:
    """``DEEPGAP_DECODE_ANGLES``: ``kernel`` (this module's op, the default) or ``inductor`` (its formula)."""
    return switches.read("DEEPGAP_DECODE_ANGLES")


@triton.jit
def angles_kernel(
    pos_ptr, inv_ptr, cos_ptr, sin_ptr, HALF: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    """Position ``program_id``'s row: ``cos`` and ``sin`` of ``[p · inv, p · inv]`` (fp32), in the outputs' dtype."""
    pdl_enter(PDL)  # the position is the previous kernel's write (the last replay's feed)
    r = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    ok = i < 2 * HALF
    p = tl.load(pos_ptr + r).to(tl.float32)
    f = p * tl.load(inv_ptr + i % HALF, mask=ok, other=0.0)
    tl.store(cos_ptr + r * 2 * HALF + i, tl.cos(f).to(cos_ptr.dtype.element_ty), mask=ok)
    tl.store(sin_ptr + r * 2 * HALF + i, tl.sin(f).to(sin_ptr.dtype.element_ty), mask=ok)


def compute(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's launch behind `rope_angles` (apart, so that `benchmarks/sm90_cases.py` launches it on meta)."""
    half = inv_freq.numel()
    cos = torch.empty(positions.numel(), 2 * half, dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    launcher(angles_kernel, positions.device)[(positions.numel(),)](
        positions.contiguous(), inv_freq.float().contiguous(), cos, sin, HALF=half,
        BLOCK=triton.next_power_of_2(2 * half), num_warps=1,
    )  # fmt: skip
    return cos, sin


@torch.library.custom_op("deepgap::rope_angles", mutates_args=())
def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(len(positions), 2 · len(inv_freq))`` in ``dtype``: `Llama.angles` in one kernel."""
    return compute(positions, inv_freq, dtype)


@rope_angles.register_kernel("cpu")
def _(positions, inv_freq, dtype):
    # on the CPU the op is the formula: Triton's interpreter runs the kernel there in 3.9 ms against torch's 22 µs
    # (the 2-core development machine), in every step of a CPU serve; the kernel's own CPU tests call `compute`
    return reference(positions, inv_freq, dtype)


@rope_angles.register_fake
def _(positions, inv_freq, dtype):
    cos = positions.new_empty(positions.numel(), 2 * inv_freq.numel(), dtype=dtype)
    return cos, torch.empty_like(cos)


def describe(model) -> str:
    """What a decode row says of its angles (`Decode.angles`).

    "one kernel" where this op computes them on a GPU, else "formula" (the op runs it on CPU tensors).
    """
    on_gpu = model.embed_tokens.weight.device.type == "cuda"
    return "one kernel" if getattr(model, "angle_fn", None) is rope_angles and on_gpu else "formula"


reference = angles_formula  # the model's torch formula (`Llama.angles` without the switch): what the kernel is held to
