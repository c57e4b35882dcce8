"""The BERT-shaped encoder's torch modules (`deepgap.measure.models.bert` holds the shapes and registry rows).

This module imports torch at the top; the registry imports it only to build.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own spelling

try:  # FlashAttention over packed sequences (torch ≥ 2.9); bound here, not imported inside a compiled forward
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None


class Layer(nn.Module):
    """One post-LayerNorm encoder layer: fused QKV, SDPA (or a packed batch's attention), GELU MLP."""

    # the MLP's chain, in order: an engine may fuse the activation into the first Linear
    # (`deepgap.measure.quant.fused_mlp`); nothing but these three runs between ff1's input and ff2's output
    mlp_chain = ("ff1", "act", "ff2")

    def __init__(self, cfg) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # BertModel's query, key, value, fused
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ff1 = nn.Linear(cfg.hidden, cfg.ff)
        self.act = nn.GELU()  # exact (erf), as BertModel's "gelu"; a module, so an engine can fuse it
        self.ff2 = nn.Linear(cfg.ff, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x, mask=None, packed=None):
        """``x`` (b, s, hidden); ``mask`` (b, 1, 1, s) a padded batch's keys; ``packed`` a packed batch's layout."""
        b, s, h = x.shape
        if packed is not None:  # (1, tokens, h): sequences end to end, no padding (`Bert.set_text_batch`)
            q, k, v = self.qkv(x).view(s, 3, self.heads, self.head_dim).unbind(1)
            a = packed.attend(q, k, v).reshape(1, s, h)
        else:
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            # (b, heads, s, head_dim); ``mask`` (b, 1, 1, s) bool, True = a token: padded keys are ignored
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(a))
        return self.ln2(x + self.ff2(self.act(self.ff1(x))))


def build_bert(cfg):
    """A `deepgap.measure.models.bert.BertConfig` as an ``nn.Module`` (fp32, CPU); the caller seeds torch first.

    ``cfg`` is untyped: `deepgap.measure.models.bert` imports this module to build, so it cannot import that.
    """

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.word = nn.Embedding(cfg.vocab, cfg.hidden)
            self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
            self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
            self.ln = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
            self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
            self.pooler = nn.Linear(cfg.hidden, cfg.hidden)
            # positions as a buffer, as BertModel keeps them (not saved: state dicts stay BertModel-shaped);
            # an arange in forward would also be an extra op in every counted and traced step
            self.register_buffer("positions", torch.arange(cfg.max_positions), persistent=False)
            self.text_batch = None  # a mixed-length batch (`set_text_batch`), and its layout:
            self.packed: Packed | None = None
            self.register_buffer(
                "text_mask", None, persistent=False
            )  # (batch, longest): a padded batch's tokens
            # BertModel's initialisation: N(0, 0.02) weights, zero biases (keeps random activations O(1))
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def set_text_batch(self, batch) -> None:
            """Run every later call as the mixed-length batch ``batch`` (`deepgap.measure.models.text_batch`).

            "packed": the real tokens of the (batch, longest) ids are gathered end to end and every layer
            runs on them alone; "padded": the ids run as they are, their padded keys masked. The layout is
            buffers (moved with the model, captured in a CUDA graph); ``None`` goes back to full sequences.
            """
            device = self.word.weight.device  # the layout's tensors where the model already is
            self.text_batch = batch
            packed = batch is not None and batch.mode == "packed"
            self.packed = Packed.of_batch(batch).to(device) if packed else None
            mask = batch.mask.to(device) if batch is not None and batch.mode == "padded" else None
            self.register_buffer("text_mask", mask, persistent=False)

        def forward(self, ids, mask=None, packed=None):
            """Pooled output of ``ids`` (b, s); ``mask`` (b, s) bool marks tokens apart from padding.

            Without a mask (every measured sweep of full sequences) every position is a token and attention
            runs unmasked; a served batch padded to its longest or its bucket passes one, so padded keys
            change no token's output (BertModel's key padding mask). Row 0 (the pooled token) is always a
            token. A mixed-length batch (`set_text_batch`) is packed or masked as it says; ``packed`` (a
            `Packed` layout of this call's batch, a served one) packs this call alone.
            """
            if packed is not None or self.packed is not None:
                return self._forward_packed(ids, packed or self.packed)
            if mask is None and self.text_mask is not None:
                mask = self.text_mask
            x = self.word(ids) + self.position(self.positions[: ids.shape[1]]) + self.token_type.weight[0]
            # (one segment: token type 0)
            x = self.ln(x)
            keys = None if mask is None else mask[:, None, None, :]
            for layer in self.layers:
                x = layer(x, keys)
            return torch.tanh(self.pooler(x[:, 0]))

        def _forward_packed(self, ids, p):
            flat = ids.reshape(-1).index_select(0, p.index)
            x = self.word(flat) + self.position(p.positions) + self.token_type.weight[0]
            x = self.ln(x)[None]  # (1, tokens, hidden)
            for layer in self.layers:
                x = layer(x, None, p)
            return torch.tanh(self.pooler(x[0].index_select(0, p.starts)))

    return Bert()


class Packed(nn.Module):
    """A packed batch's index tensors (buffers: they move and are captured with the model) and its attention.

    Attention runs through ``torch.nn.attention.varlen`` (FlashAttention over each sequence) where it can:
    a CUDA tensor in half precision, torch ≥ 2.9. Elsewhere (the CPU, fp32, an older torch) the packed q, k, v
    are scattered into a padded (batch, heads, longest, head_dim) block, attended with the key mask, and
    gathered back. The Linears, most of the work, run on the real tokens either way. ``ran`` says which
    attention an eager call took (`kind` gives it for a device and dtype where no eager call was made).
    """

    VARLEN = "varlen FlashAttention (torch.nn.attention.varlen)"
    PADDED = "padded SDPA with a key mask"

    def __init__(self, index, positions, mask, cu_seqlens) -> None:
        """``index``/``positions`` (tokens,) int64, ``mask`` (rows, longest) bool, ``cu_seqlens`` (rows + 1,) int32."""
        super().__init__()
        for name, t in (
            ("index", index),
            ("positions", positions),
            ("mask", mask),
            ("cu_seqlens", cu_seqlens),
        ):
            self.register_buffer(name, t, persistent=False)
        self.register_buffer("starts", cu_seqlens[:-1].long(), persistent=False)
        self.rows, self.longest = mask.shape
        self.ran: str | None = None

    @classmethod
    def of_batch(cls, batch) -> Packed:
        """A sweep's batch (`deepgap.measure.models.text_batch.TextBatch`), its layout made on the CPU."""
        return cls(batch.index, batch.positions, batch.mask, batch.cu_seqlens)

    @classmethod
    def of_lengths(cls, lens: torch.Tensor, tokens: int, longest: int) -> Packed:
        """A served batch's layout, made where ``lens`` (int64, one per row) is, without reading it back.

        ``tokens``: their sum and ``longest``: their maximum, which the caller knows on the host (a device
        read would stall the serving pipeline).
        """
        dev, rows = lens.device, lens.shape[0]
        cu = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(lens, 0)
        row = torch.repeat_interleave(torch.arange(rows, device=dev), lens, output_size=tokens)
        positions = torch.arange(tokens, device=dev) - cu[:-1].long()[row]
        mask = torch.arange(longest, device=dev)[None, :] < lens[:, None]
        return cls(row * longest + positions, positions, mask, cu)

    @classmethod
    def kind(cls, device: torch.device | str, dtype: torch.dtype) -> str:
        """The attention a packed batch takes on ``device`` in ``dtype``: `VARLEN` or `PADDED`."""
        half = dtype in (torch.float16, torch.bfloat16)
        return cls.VARLEN if torch.device(device).type == "cuda" and half and varlen_attn else cls.PADDED

    def attend(self, q, k, v):
        """Attention of packed (tokens, heads, head_dim) q, k, v within each sequence; the same shape out."""
        kind = self.kind(q.device, q.dtype)
        if not torch.compiler.is_compiling():
            self.ran = kind
        if kind == self.VARLEN:
            n = self.longest
            return varlen_attn(q, k, v, self.cu_seqlens, self.cu_seqlens, n, n)
        t, heads, d = q.shape

        def pad(u):
            block = u.new_zeros(self.rows * self.longest, heads, d).index_copy(0, self.index, u)
            return block.view(self.rows, self.longest, heads, d).transpose(1, 2)

        keys = self.mask[:, None, None, :]
        a = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=keys)
        return a.transpose(1, 2).reshape(self.rows * self.longest, heads, d).index_select(0, self.index)
