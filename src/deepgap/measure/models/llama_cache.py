"""The decoder's static KV cache: K and V of every layer allocated once, in the model's dtype or as fp8 codes.

Why fp8 codes (``--kv-caches fp8``, `StaticKVCache` with ``codes``): at a large batch or a long context a decode
step reads more cache than weights (8B at batch 512 and 128 + 128 tokens: about 12.6 GB of bf16 K and V a step
against 8 GB of fp8 weights), so halving the cache's bytes is what a throughput server does (vLLM's
``--kv-cache-dtype fp8``). The codes are e4m3 at scale 1, saturating at ±448, as vLLM's fp8 cache without
calibration: K and V after RMSNorm and the projections are O(1)-O(10), inside e4m3's range; a value past it is
clamped, and the row's logits against fp32 (every decode row's check) say what the codes cost.

`LayerCache` is one layer's view: it writes a step's K and V (`encode`: the codes where the cache holds them)
and attends over what is written, reading codes back as the model's dtype (`decode`) for SDPA; the decode
attention kernel (`deepgap.measure.llm_attention`) and the RoPE GEMV (`deepgap.measure.quant.gemv_fused`) read
and write the codes themselves. With the model's dtype `encode` and `decode` return their tensor as it is, so
that cache's path is unchanged.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

from deepgap.measure.models.llama_config import LlamaShape
from deepgap.measure.models.llama_packed import PackedTokens, SlotPositions, SlotPrefill

FP8_CODES = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value: codes saturate here (a cast past it would give NaN)


def codes_of(kv_cache: str | None) -> torch.dtype | None:
    """`Llama.kv_codes` for a configuration's ``kv_cache`` (`ConfigSpec.kv_cache`): fp8 codes, or None (own dtype)."""
    return FP8_CODES if kv_cache == "fp8" else None


class StaticKVCache:
    """K and V of every layer, ``[batch, kv_heads, max_len, head_dim]``, allocated once.

    ``codes``: the storage dtype where it is not the model's (`FP8_CODES`); None: the model's ``dtype``.
    """

    def __init__(
        self, shape: LlamaShape, batch: int, max_len: int, dtype, device, codes: torch.dtype | None = None
    ) -> None:
        self.batch, self.max_len = batch, max_len
        self.dtype = dtype  # what attention computes in: codes are read back as this
        self.stored = codes or dtype
        dims = (batch, shape.kv_heads, max_len, shape.head_dim)
        self.k = [torch.zeros(dims, dtype=self.stored, device=device) for _ in range(shape.layers)]
        self.v = [torch.zeros(dims, dtype=self.stored, device=device) for _ in range(shape.layers)]
        self.gqa = shape.heads != shape.kv_heads
        self.positions = torch.arange(max_len, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on its device (all layers, K and V)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def encode(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the cache stores it: clamped to ±`FP8_MAX` and cast where the cache holds codes."""
        if t.dtype == self.stored:
            return t
        return t.clamp(-FP8_MAX, FP8_MAX).to(self.stored)

    def decode(self, t: torch.Tensor) -> torch.Tensor:
        """Cached K or V as the model's dtype, for SDPA (the codes are exact in bf16 and fp16)."""
        return t if t.dtype == self.dtype else t.to(self.dtype)


class LayerCache:
    """One layer's view of the cache: writes this step's K and V, attends over what is written."""

    def __init__(self, cache: StaticKVCache, i: int, attention=None) -> None:
        self.k, self.v, self.cache, self.attention = cache.k[i], cache.v[i], cache, attention

    def attend(self, q, k, v, pos):
        """Write ``k``, ``v`` from ``pos`` on; attend ``q`` causally over everything written so far."""
        if isinstance(pos, (SlotPrefill, SlotPositions)):
            return self._attend_slots(q, k, v, pos)
        if isinstance(pos, PackedTokens):
            return pos.attend(self, q, k, v)
        s, enc = q.shape[2], self.cache.encode
        if not isinstance(pos, int):  # a tensor position: static shapes, one token
            self.k.index_copy_(2, pos, enc(k))
            self.v.index_copy_(2, pos, enc(v))
            return self.attend_written(q, pos)
        self.k[:, :, pos : pos + s] = enc(k)
        self.v[:, :, pos : pos + s] = enc(v)
        if s == 1:
            return self.attend_written(q, pos)
        # prefill (pos 0): causal over the prompt
        keys, values = self._read(self.k[:, :, : pos + s], self.v[:, :, : pos + s])
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=self.cache.gqa)

    def attend_written(self, q, pos):
        """One decode token ``q`` over the cache as written up to ``pos`` (its own K and V there already).

        Apart from `attend` for a step that writes them itself (`deepgap.measure.llm_fused`'s RoPE GEMV).
        """
        if isinstance(pos, int):  # eager: read only the keys written
            return one_token(q, *self._read(self.k[:, :, : pos + 1], self.v[:, :, : pos + 1]), None)
        if self.attention is not None:  # the worker's kernel (`Llama.static_attention`) reads codes itself
            return self.attention(q, self.k, self.v, pos)
        mask = (self.cache.positions <= pos)[None, :]  # later ones masked
        return one_token(q, *self._read(self.k, self.v), mask)

    def _read(self, keys, values):
        return self.cache.decode(keys), self.cache.decode(values)

    def _attend_slots(self, q, k, v, pos):
        """Continuous batching: a prefill into some rows, or one token per row at its own position."""
        enc = self.cache.encode
        if isinstance(pos, SlotPrefill):  # the prompts alone, causal; their K and V into their rows
            s = q.shape[2]
            self.k[pos.slots, :, :s] = enc(k)
            self.v[pos.slots, :, :s] = enc(v)
            return F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=self.cache.gqa)
        b = q.shape[0]
        p = pos.positions
        # Each row's K and V at its own position, written as an index_put on the whole cache tensor: a
        # scatter_ into the view ``self.k[:b]`` compiled (torch.compile functionalizes a mutated view of an
        # input) into a copy of the layer's whole cache per step, 35.7 ms per 8B step at 512 slots on an
        # H200 against 12.3 ms for the sweep's step; index_put stays in place.
        rows = torch.arange(b, device=p.device)
        self.k[rows, :, p] = enc(k[:, :, 0])
        self.v[rows, :, p] = enc(v[:, :, 0])
        keys, values = self.k[:b], self.v[:b]  # the first b rows: the slots (a view, static shape)
        if self.attention is not None:  # the worker's kernel, each row up to its own position
            return self.attention(q, keys, values, p)
        mask = (self.cache.positions[None, :] <= p[:, None])[:, None, None, :]  # (b, 1, 1, max_len)
        return one_token(q, *self._read(keys, values), mask)


def one_token(q, keys, values, mask):
    """Attention of one query token per sequence, its query heads folded onto their shared KV head.

    Why fold: with GQA, the ``heads / kv_heads`` query heads of a group read the same keys, so for a
    single token they are that many query *rows* of one head: ``(b, heads, 1, d)`` viewed as
    ``(b, kv_heads, group, d)`` is plain multi-head attention, which every SDPA kernel takes with a
    mask (``enable_gqa`` with a mask leaves only the math kernel on a GPU), and K and V are read once
    per group. HF's grouping is the same: query head h uses KV head h // group.
    """
    b, nq, _, d = q.shape
    nkv = keys.shape[1]
    a = F.scaled_dot_product_attention(q.reshape(b, nkv, nq // nkv, d), keys, values, attn_mask=mask)
    # reshape, not view: a GPU kernel's output is laid out (b, group, kv_heads, d) in memory, so its two
    # head dimensions are not adjacent (a CPU's is contiguous; every GPU decode failed on a view here)
    return a.reshape(b, nq, 1, d)
