"""Bytes and FLOPs of a decoder's decode step and prefill, from its shape alone: the roofline of decode.

Why analytic: a decode step at small batch reads every weight once and the whole KV cache once, and
does two FLOPs per weight per sequence, so its place on the roofline follows from the shape, the batch,
the context and the bytes per element; no module needs to be built (the 8B model's numbers come in
microseconds). Issue 51's anchor: Llama-3.1-8B in fp8 at batch 1 reads ≈ 7.5 GB of weights per token
(every weight but the embedding table, whose B rows are all a step reads), so an H200's 4.8 TB/s
bounds it at ≈ 640 tokens/s.

What is counted, per decode step at batch ``B`` with ``context`` tokens already in the cache:

- **weights read**: every layer matrix and norm, the final norm and the head (``vocab × hidden``);
  the embedding table only for its ``B`` rows, unless it is the tied head (then it is the head);
  the GEMM weights (projections, MLP, head) at ``Itemsizes.linear`` bytes (1 for fp8/int8 Linears),
  the rest (norms, embedding rows) at ``Itemsizes.other`` (bf16 beside 8-bit Linears);
- **KV read and written**: ``B × (context + 1)`` tokens' K and V in every layer (the cache read, the
  new token written) at ``Itemsizes.kv`` bytes;
- **FLOPs**: 2 per multiply-accumulate: ``2·B`` per GEMM weight (projections, MLP, head) and
  attention's QKᵀ and AV, ``4·B·heads·head_dim·(context + 1)`` per layer. Norms, RoPE, softmax and
  SiLU are not counted (under 1% at these shapes).

Activations are not counted: at decode they are ``B × hidden`` vectors, kilobytes against gigabytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgap.measure.models.llama_config import LlamaShape


@dataclass(frozen=True)
class Itemsizes:
    """Bytes per element of a decoder as built: its GEMM weights, the rest of its weights, its KV cache.

    ``linear``: the projections', the MLP's and the head's weights (1 for fp8/int8 Linears); ``other``: the
    norms and the embedding rows (bf16 beside 8-bit Linears); ``kv``: the cache's K and V. Why one value:
    they were three positional numbers in two orders (the report's list linear-first, `decode_cost`'s
    parameters linear-last).
    """

    linear: float = 2
    other: float = 2
    kv: float = 2


BF16 = Itemsizes()


@dataclass(frozen=True)
class StepCost:
    """What one forward step (a decode step or a prefill) reads and computes, and how many tokens it yields."""

    tokens: int  # tokens the step processes (decode: the batch, one each; prefill: batch × input length)
    weight_bytes: float
    kv_bytes: float
    flops: float

    @property
    def bytes(self) -> float:
        """Bytes moved from device memory by the step: weights plus KV cache."""
        return self.weight_bytes + self.kv_bytes

    @property
    def bytes_per_token(self) -> float:
        """Bytes per processed token (decode at batch B shares one read of the weights among B tokens)."""
        return self.bytes / self.tokens

    @property
    def flops_per_token(self) -> float:
        """FLOPs per processed token."""
        return self.flops / self.tokens

    @property
    def intensity(self) -> float:
        """FLOPs per byte: the roofline's x axis (decode at batch 1 is ≈ 2 / weight itemsize)."""
        return self.flops / self.bytes

    def bound_tokens_per_s(self, bandwidth_bytes_s: float, peak_flops: float | None = None) -> float:
        """The roofline's ceiling: tokens/s if the step ran at full bandwidth (and, if given, peak FLOPs)."""
        t = self.bytes / bandwidth_bytes_s
        if peak_flops:
            t = max(t, self.flops / peak_flops)
        return self.tokens / t


def gemm_weights(shape: LlamaShape) -> int:
    """Weights that a token multiplies once each: every layer's projections and MLP, and the head."""
    h, d = shape.hidden, shape.head_dim
    per_layer = 2 * h * shape.heads * d + 2 * h * shape.kv_heads * d + 3 * h * shape.intermediate
    return shape.layers * per_layer + shape.vocab * h


def weights_read(shape: LlamaShape, batch: int) -> int:
    """Parameters one decode step reads: all but the embedding table, of which only ``batch`` rows.

    A tied head is the embedding table, read whole by the head's GEMM, so then every parameter counts.
    """
    if shape.tied:
        return shape.params()
    return shape.params() - shape.vocab * shape.hidden + min(batch, shape.vocab) * shape.hidden


def weight_bytes(shape: LlamaShape, rows: int, sizes: Itemsizes) -> float:
    """Bytes of the weights a step over ``rows`` tokens reads (`weights_read`), each at its itemsize."""
    gemm = gemm_weights(shape)
    return gemm * sizes.linear + (weights_read(shape, rows) - gemm) * sizes.other


def decode_cost(shape: LlamaShape, batch: int, context: float, sizes: Itemsizes = BF16) -> StepCost:
    """One decode step at ``batch`` with ``context`` tokens in the cache (the module docstring's rules)."""
    attended = context + 1
    attention = 4 * batch * shape.layers * shape.heads * shape.head_dim * attended
    return StepCost(
        tokens=batch,
        weight_bytes=weight_bytes(shape, batch, sizes),
        kv_bytes=batch * attended * shape.kv_bytes_per_token(sizes.kv),
        flops=2 * batch * gemm_weights(shape) + attention,
    )


def prefill_cost(shape: LlamaShape, batch: int, input_len: int, sizes: Itemsizes = BF16) -> StepCost:
    """The prefill of ``batch`` prompts of ``input_len`` tokens: compute-bound, the head on the last token.

    Attention is counted causally (token i attends to i + 1 keys: ``s(s+1)/2`` pairs), as the fused
    kernels compute it; torch's FLOP counter counts the full ``s²`` square.
    """
    s, h = input_len, shape.hidden
    layer_gemm = gemm_weights(shape) - shape.vocab * h
    pairs = s * (s + 1) // 2
    attention = 4 * batch * shape.layers * shape.heads * shape.head_dim * pairs
    return StepCost(
        tokens=batch * s,
        weight_bytes=weight_bytes(shape, batch * s, sizes),
        kv_bytes=batch * s * shape.kv_bytes_per_token(sizes.kv),
        flops=2 * batch * s * layer_gemm + 2 * batch * shape.vocab * h + attention,
    )
