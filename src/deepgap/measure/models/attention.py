"""Self-attention as two Linears and one SDPA call, in place of ``nn.MultiheadAttention``.

Why: torchvision's ViT runs attention through ``nn.MultiheadAttention``. Eager PyTorch then takes its
native fused fast path, but torch.compile traces the general path instead (the fast path is skipped
while tracing), and on one H200 ViT-B/16 fp16 at batch 256 ran 9.1k img/s compiled against 10.0k
eager; the same arithmetic as `SelfAttention` compiles to 10.6k (results/h200/session17). The quant
engine needs it too: the module's projections must be Linear modules to be swapped for 8-bit ones,
and ``nn.MultiheadAttention``'s fused path reads ``in_proj_weight`` directly.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own spelling


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention(batch_first=True)`` as self-attention, in two Linears and one SDPA call."""

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        if not mha.batch_first or not mha._qkv_same_embed_dim:
            raise ValueError("only batch-first self-attention with one embedding width is unfused")
        e = mha.embed_dim
        self.heads = mha.num_heads
        self.in_proj = nn.Linear(e, 3 * e, bias=mha.in_proj_bias is not None)
        self.in_proj.weight = mha.in_proj_weight
        if mha.in_proj_bias is not None:
            self.in_proj.bias = mha.in_proj_bias
        self.out_proj = nn.Linear(e, e, bias=mha.out_proj.bias is not None)
        self.out_proj.weight = mha.out_proj.weight
        if mha.out_proj.bias is not None:
            self.out_proj.bias = mha.out_proj.bias

    def forward(self, query, key=None, value=None, need_weights=False, **_):
        """Self-attention of ``query`` (key and value are the same tensor); returns (output, None)."""
        b, s, e = query.shape
        qkv = self.in_proj(query).view(b, s, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(*qkv.unbind(0))
        return self.out_proj(a.transpose(1, 2).reshape(b, s, e)), None


def unfuse_attention(model: nn.Module) -> int:
    """Replace every ``nn.MultiheadAttention`` in ``model`` by `SelfAttention`; returns how many."""
    swaps = [(p, n, m) for p in model.modules() for n, m in p.named_children()]
    count = 0
    for parent, name, child in swaps:
        if isinstance(child, nn.MultiheadAttention):
            setattr(parent, name, SelfAttention(child))
            count += 1
    return count
