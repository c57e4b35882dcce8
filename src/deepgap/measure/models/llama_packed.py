"""A packed prefill's attention: several prompts as one sequence of token rows (vLLM's layout), for `Llama`.

Why: a padded admission (`Llama.prefill_slots`) pads every prompt to the longest and the count to a bucket,
and the prefill of an 8B decoder is compute-bound, so a padded row costs what a real one does (session 20:
a bucket of 6 × 256 = 1,536 rows held about 800 real ones). Packed, the newcomers' prompts are concatenated
into ``T`` rows, ``T`` padded only to a bucket of total tokens (`deepgap.serving.worker.llm_prefill`).

Each row carries its position within its own prompt (RoPE and the cache position) and the cache row (slot)
its K and V go to. The slot is also the row's **segment**: an admission puts each prompt in its own slot,
so two rows attend to each other only where they share a slot, causally by position. Padding rows aim at
the executor's sink row at position 0: they attend to each other (each at least to itself, so no row of
the mask is empty and no output is NaN) and no real row sees them.

The continuous batch's two other kinds of ``pos`` (`SlotPrefill`, `SlotPositions`) are defined here too.
"""

from __future__ import annotations

from torch.nn import functional as F  # noqa: N812 - torch's own spelling


class SlotPrefill:
    """`Llama.prefill_slots`'s ``pos``: the cache rows that newcomers' prompts go to (from position 0)."""

    def __init__(self, slots) -> None:
        self.slots = slots


class SlotPositions:
    """`Llama.decode_slots`'s ``pos``: one position per cache row, ``(B,)``, and its write index and mask."""

    def __init__(self, positions) -> None:
        self.positions = positions


class PackedTokens:
    """`Llama.prefill_packed`'s ``pos``: per token row its position and cache row ``(T,)``, and the mask."""

    def __init__(self, positions, slots) -> None:
        self.positions, self.slots = positions, slots
        # (1, 1, T, T), built once per call on the device: same segment (slot), and causal by position
        same = slots[:, None] == slots[None, :]
        self.mask = (same & (positions[:, None] >= positions[None, :]))[None, None]

    def attend(self, layer_cache, q, k, v):
        """Write every row's K and V at (its slot, its position); attend within each prompt, causally.

        The write is an index_put on the whole cache tensor, as `LayerCache._attend_slots`' decode write
        (a scatter into a view compiles into a copy of the layer's cache). K and V are expanded to the
        query heads so that SDPA takes the boolean mask in its memory-efficient kernel on a GPU
        (``enable_gqa`` with a mask leaves only the math kernel, which materialises ``heads × T × T``).
        """
        enc = layer_cache.cache.encode  # fp8 codes where the cache holds them (`llama_cache`)
        layer_cache.k[self.slots, :, self.positions] = enc(k[0].transpose(0, 1))
        layer_cache.v[self.slots, :, self.positions] = enc(v[0].transpose(0, 1))
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def packed_logits(model, ids, positions, slots, last):
    """`Llama.prefill_packed`'s body: the layers over the packed rows, the head at rows ``last``."""
    x = model.hidden_states(ids[None], positions, PackedTokens(positions, slots))
    return model.lm_head(x[0, last])
