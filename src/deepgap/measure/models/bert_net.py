"""The BERT-shaped encoder's torch modules (`deepgap.measure.models.bert` holds the shapes and registry rows).

This module imports torch at the top; the registry imports it only to build.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own spelling


def build_bert(cfg):
    """A `deepgap.measure.models.bert.BertConfig` as an ``nn.Module`` (fp32, CPU); the caller seeds torch first.

    ``cfg`` is untyped: `deepgap.measure.models.bert` imports this module to build, so it cannot import that.
    """

    class Layer(nn.Module):
        # the MLP's chain, in order: an engine may fuse the activation into the first Linear
        # (`deepgap.measure.quant.fused_mlp`); nothing but these three runs between ff1's input and ff2's output
        mlp_chain = ("ff1", "act", "ff2")

        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # BertModel's query, key, value, fused
            self.out = nn.Linear(cfg.hidden, cfg.hidden)
            self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
            self.ff1 = nn.Linear(cfg.hidden, cfg.ff)
            self.act = nn.GELU()  # exact (erf), as BertModel's "gelu"; a module, so an engine can fuse it
            self.ff2 = nn.Linear(cfg.ff, cfg.hidden)
            self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

        def forward(self, x, mask=None):
            b, s, h = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            # (b, heads, s, head_dim); ``mask`` (b, 1, 1, s) bool, True = a token: padded keys are ignored
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, h)))
            return self.ln2(x + self.ff2(self.act(self.ff1(x))))

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.word = nn.Embedding(cfg.vocab, cfg.hidden)
            self.position = nn.Embedding(cfg.max_positions, cfg.hidden)
            self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
            self.ln = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg.layers))
            self.pooler = nn.Linear(cfg.hidden, cfg.hidden)
            # positions as a buffer, as BertModel keeps them (not saved: state dicts stay BertModel-shaped);
            # an arange in forward would also be an extra op in every counted and traced step
            self.register_buffer("positions", torch.arange(cfg.max_positions), persistent=False)
            # BertModel's initialisation: N(0, 0.02) weights, zero biases (keeps random activations O(1))
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def forward(self, ids, mask=None):
            """Pooled output of ``ids`` (b, s); ``mask`` (b, s) bool marks tokens apart from padding.

            Without a mask (every measured sweep) every position is a token and attention runs unmasked;
            a served batch padded to its longest or its bucket passes one, so padded keys change no
            token's output (BertModel's key padding mask). Row 0 (the pooled token) is always a token.
            """
            x = self.word(ids) + self.position(self.positions[: ids.shape[1]]) + self.token_type.weight[0]
            # (one segment: token type 0)
            x = self.ln(x)
            keys = None if mask is None else mask[:, None, None, :]
            for layer in self.layers:
                x = layer(x, keys)
            return torch.tanh(self.pooler(x[:, 0]))

    return Bert()
