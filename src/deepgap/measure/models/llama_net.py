"""The Llama-architecture decoder's torch modules, with a static KV cache: prefill, then one token per step.

Why plain torch (as `deepgap.measure.models.bert`): nothing is downloaded, transformers is not needed
to measure, and every engine (eager, torch.compile, CUDA graphs) sees one small graph. It is HF's
``LlamaForCausalLM`` exactly (pre-RMSNorm, RoPE with Llama-3's scaling, grouped-query attention through
``scaled_dot_product_attention(enable_gqa=True)``, SwiGLU, tied or untied head), with two layout changes
that decode speed wants: Q, K and V are one ``qkv_proj`` matrix and gate and up one ``gate_up_proj``,
so a decode step launches 4 GEMMs per layer instead of 7 (`llama_weights.from_hf` concatenates HF's).
`tests/measure/models/test_llm_model.py` checks logits and greedy tokens against transformers with the same weights.

The KV cache is static: ``setup_cache(batch, max_len)`` preallocates ``[batch, kv_heads, max_len,
head_dim]`` K and V per layer in the model's dtype (or fp8 codes: `deepgap.measure.models.llama_cache`) and
device, so no step allocates and the decode step's shapes never change. ``prefill(ids)`` fills positions
``0..S-1`` and returns the next-token
logits; ``decode_step(ids, position)`` writes one position and returns the next logits. A Python int
``position`` attends over the cache's first ``position + 1`` entries (eager: reads only what is
there); a tensor ``position`` keeps every shape static, so torch.compile and a CUDA graph can capture the
step once and replay it at every position: its attention is SDPA over the whole cache with a mask, or
the kernel the worker plugs into ``static_attention`` (`deepgap.measure.llm_steps` does, on a GPU in half
precision: `deepgap.measure.llm_attention` reads the cache only up to the position on the device).

This module imports torch at the top; `deepgap.measure.models.llama` (the registry rows) imports it only to
build. `build_llama` builds a named shape, a `LlamaShape` or a local HF folder.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

from deepgap.core.errors import UsageError
from deepgap.measure.models.llama_cache import LayerCache, StaticKVCache
from deepgap.measure.models.llama_config import SHAPES, LlamaShape, check_run, inv_frequencies, shape_of
from deepgap.measure.models.llama_init import init_weights
from deepgap.measure.models.llama_packed import SlotPositions, SlotPrefill, packed_logits


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (no bias, no mean subtraction)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):  # noqa: D102
        # HF's order: normalise in fp32, cast back, then scale, so bf16 rounds where HF's rounds
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotate(x, cos, sin):
    """RoPE in HF's half-split convention: ``x·cos + rotate_half(x)·sin`` (angles already in x's dtype)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query attention: ``heads`` queries share ``kv_heads`` keys and values; one fused QKV GEMM."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.nq, self.nkv, self.d = shape.heads, shape.kv_heads, shape.head_dim
        self.qkv_proj = nn.Linear(shape.hidden, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.o_proj = nn.Linear(self.nq * self.d, shape.hidden, bias=False)

    def forward(self, x, cos, sin, cache, pos):  # noqa: D102
        b, s, _ = x.shape
        return self.o_proj(self.mix(self.qkv_proj(x), b, s, cos, sin, cache, pos))

    def mix(self, qkv, b: int, s: int, cos, sin, cache, pos):
        """The projected ``qkv`` through RoPE and attention: ``(b, s, heads · head_dim)``, before ``o_proj``.

        Apart from `forward` so that a fused decode layer (`deepgap.measure.llm_fused`) that projects
        with its own kernels runs the same attention.
        """
        qkv = qkv.view(b, s, self.nq + 2 * self.nkv, self.d).transpose(1, 2)
        q, k, v = qkv.split((self.nq, self.nkv, self.nkv), dim=1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is None:  # stateless forward: causal attention over the input alone
            a = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=self.nq != self.nkv)
        else:
            a = cache.attend(q, k, v, pos)
        return a.transpose(1, 2).reshape(b, s, self.nq * self.d)


class Layer(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + down(silu(gate) · up) of norm(x)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.rms_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.rms_eps)
        self.gate_up_proj = nn.Linear(shape.hidden, 2 * shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x, cos, sin, cache, pos):  # noqa: D102
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    """The decoder: embedding, layers, final norm, head; `setup_cache` allocates the static cache."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, shape.rms_eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        self.cache: StaticKVCache | None = None
        # the static step's attention ``fn(q, k, v, pos)`` where the worker plugs one in
        # (`deepgap.measure.llm_steps`: `deepgap.measure.llm_attention` on a GPU); None: SDPA over the masked cache
        self.static_attention = None
        # the angles ``fn(positions, inv_freq, dtype) -> (cos, sin)`` where a fused decoder plugs one in
        # (`deepgap.measure.llm_angles`, ``DEEPGAP_DECODE_ANGLES=kernel``); None: the torch formula below
        self.angle_fn = None
        # the cache's storage where it is not the model's dtype: fp8 codes (`llama_cache`, ``--kv-caches fp8``),
        # set by the worker before `setup_cache`; None: the model's dtype
        self.kv_codes: torch.dtype | None = None
        # fp32 angles kept off the module's buffers: `.half()` must not round them (HF keeps them fp32 too);
        # made on the host whatever the device being built on (a meta build's angles are moved with the model)
        self.inv_freq = torch.tensor(inv_frequencies(shape), dtype=torch.float32, device="cpu")
        if shape.tied:
            self.lm_head.weight = self.embed_tokens.weight

    def _apply(self, fn, recurse=True):
        """``.to(device)`` and ``.cuda()`` move the fp32 angles too (a dtype cast leaves them fp32)."""
        super()._apply(fn, recurse)
        self.inv_freq = self.inv_freq.to(self.embed_tokens.weight.device)
        return self

    def angles(self, positions, dtype):
        """The cos and sin ``(len, head_dim)`` for ``positions``: fp32 products, then cast (HF's order)."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        if self.angle_fn is not None:
            return self.angle_fn(positions, self.inv_freq, dtype)
        return angles_formula(positions, self.inv_freq, dtype)

    def hidden_states(self, ids, positions, pos):
        """Embedding through the final norm, ``(batch, len, hidden)``; ``pos`` None: no cache."""
        x = self.embed_tokens(ids)
        cos, sin = self.angles(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(
                x, cos, sin, None if pos is None else LayerCache(self.cache, i, self.static_attention), pos
            )
        return self.norm(x)

    def forward(self, ids, all_logits: bool = False):
        """Stateless causal forward (no cache): the last position's logits ``(batch, vocab)``, or all.

        This is what a sweep's text-model path times as one call: a prefill without the cache writes.
        """
        self._check_ids(ids, ids.shape[-1])
        x = self.hidden_states(ids, torch.arange(ids.shape[1], device=ids.device), None)
        return self.lm_head(x if all_logits else x[:, -1])

    def setup_cache(self, batch: int, max_len: int) -> StaticKVCache:
        """Preallocate the static cache in the model's dtype (or `kv_codes`) and device, replacing any earlier one."""
        p = self.embed_tokens.weight
        check_run(self.shape, batch, max_len, self.kv_codes.itemsize if self.kv_codes else p.element_size())
        self.cache = None  # free the old one before allocating the new
        self.cache = StaticKVCache(self.shape, batch, max_len, p.dtype, p.device, self.kv_codes)
        return self.cache

    def prefill(self, ids, all_logits: bool = False):
        """Run the prompt ``(batch, S)`` into cache positions ``0..S-1``; the next-token logits."""
        self._need_cache(ids, ids.shape[-1])
        x = self.hidden_states(ids, torch.arange(ids.shape[1], device=ids.device), 0)
        return self.lm_head(x if all_logits else x[:, -1])

    def decode_step(self, ids, position):
        """One token per sequence ``(batch, 1)`` at ``position`` (an int, or a 1-element long tensor).

        Returns the logits ``(batch, vocab)`` for the token after it. A tensor position is not
        range-checked here (that would synchronize with the device at every step): its caller, the
        decode loop, checked the whole run's length against the cache when it set it up.
        """
        if isinstance(position, int):
            self._need_cache(ids, position + 1)
            if ids.shape[1] != 1:
                raise UsageError("decode takes one token per sequence", "pass ids of shape (batch, 1)")
            positions = torch.tensor([position], device=ids.device)
        else:
            self._need_cache(ids, 1)
            positions = position
        return self.lm_head(self.hidden_states(ids, positions, position)[:, -1])

    def prefill_slots(self, ids, slots, lengths):
        """Prompts ``(k, P)``, right-padded, into cache rows ``slots`` (a long tensor ``(k,)``), positions 0..P-1.

        Continuous batching's admission (`deepgap.serving.worker.llm_executor`): newcomers of different
        lengths are prefilled together while other rows of the cache hold running sequences. Right padding
        needs no mask: causal attention keeps a row's real tokens from seeing its padding, and the padding's
        keys written past a row's length sit beyond its position, masked by `decode_slots` until its own
        tokens overwrite them. Returns the next-token logits at each row's last real token, ``(k, vocab)``.
        """
        self._check_ids(ids, ids.shape[-1])
        if self.cache is None or ids.shape[1] > self.cache.max_len:
            raise UsageError(
                "the prompts do not fit the KV cache", "set up the cache with max_len ≥ the prompt"
            )
        x = self.hidden_states(ids, torch.arange(ids.shape[1], device=ids.device), SlotPrefill(slots))
        return self.lm_head(x[torch.arange(ids.shape[0], device=ids.device), lengths - 1])

    def prefill_packed(self, ids, positions, slots, last):
        """Packed prompts (`deepgap.measure.models.llama_packed`): the logits ``(G,)`` at their rows ``last``.

        ``ids``, ``positions``, ``slots`` ``(T,)``: each row's token, position in its prompt and cache row.
        """
        if self.cache is None:
            raise UsageError("the KV cache is not set up", "call setup_cache(batch, max_len) first")
        return packed_logits(self, ids, positions, slots, last)

    def decode_slots(self, ids, positions):
        """One token per cache row ``(B, 1)``, each at its own position ``(B,)`` (a long tensor on the device).

        The static-shape step of continuous batching: ``B`` is the number of slots (the cache's first ``B``
        rows), every row writes its K and V at its own position and attends over its keys up to it. Rows
        that hold no sequence run too (their output is ignored; their position stays in range), so the
        step's shapes never change and a CUDA graph can capture it once. Returns ``(B, vocab)`` logits.
        """
        if self.cache is None or ids.shape[0] > self.cache.batch:
            raise UsageError(
                f"{ids.shape[0]} slots do not fit the KV cache", "call setup_cache with at least that batch"
            )
        x = self.embed_tokens(ids)
        cos, sin = self.angles(positions, x.dtype)
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # per row: (B, 1, 1, head_dim)
        rows = SlotPositions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, LayerCache(self.cache, i, self.static_attention), rows)
        return self.lm_head(self.norm(x)[:, -1])

    def _need_cache(self, ids, end: int) -> None:
        if self.cache is None:
            raise UsageError("the KV cache is not set up", "call setup_cache(batch, max_len) first")
        self._check_ids(ids, end)
        if ids.shape[0] != self.cache.batch:
            raise UsageError(
                f"a batch of {ids.shape[0]} sequences does not fit a cache set up for {self.cache.batch}",
                "call setup_cache with this batch",
            )
        if end > self.cache.max_len:
            raise UsageError(
                f"position {end - 1} is past the cache's {self.cache.max_len} positions",
                "set up the cache with max_len of at least input + output length",
            )

    def _check_ids(self, ids, end: int) -> None:
        if ids.dim() != 2 or ids.dtype.is_floating_point:
            raise UsageError(
                f"token ids of shape {tuple(ids.shape)} and dtype {ids.dtype}",
                "pass integer ids of shape (batch, length)",
            )
        check_run(self.shape, max(ids.shape[0], 1), end, 0)


def angles_formula(positions, inv_freq, dtype):
    """RoPE's cos and sin ``(len, 2 · len(inv_freq))``: fp32 products, then cast (HF's order).

    `Llama.angles` without an ``angle_fn``, and what `deepgap.measure.llm_angles`'s kernel is held to.
    """
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def build_llama(
    source: str | LlamaShape, seed: int = 0, weights: bool = False, device: str | None = None
) -> torch.nn.Module:
    """The decoder for a named shape, a `LlamaShape` or a local HF folder/config.json, in fp32 eval mode.

    ``weights``: load ``*.safetensors`` from ``source``'s folder (HF names); otherwise seeded random
    weights. ``device``: where to build (``"meta"``: shapes only, nothing allocated).
    """
    shape = source if isinstance(source, LlamaShape) else shape_of(source)
    if weights and (not isinstance(source, str) or source in SHAPES):
        raise UsageError("weights come from a checkpoint folder", "pass the folder holding config.json")
    torch.manual_seed(seed)
    with torch.device("meta"):  # shapes only: nothing drawn at construction (`llama_init` says why)
        model = Llama(shape)
    if device == "meta":
        return model.eval()
    model.to_empty(device=device or "cpu")  # storage, uninitialised: every weight is drawn or loaded next
    if shape.tied:  # off the meta device each parameter is a new one: the head shares the embedding again
        model.lm_head.weight = model.embed_tokens.weight
    if weights:
        from deepgap.measure.models.llama_weights import load_hf_weights

        assert isinstance(source, str)
        load_hf_weights(model, source if os.path.isdir(source) else os.path.dirname(source) or ".")
    else:
        init_weights(model, seed)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights as stored: parameters (a tied head once) and buffers.

    Buffers count because an 8-bit Linear (`deepgap.measure.quant.linear.QuantLinear`) keeps its codes and
    scales as buffers, not parameters; the KV cache and the RoPE angles are neither.
    """
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
