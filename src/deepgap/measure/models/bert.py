"""BERT-class text encoders in plain torch: bert-base, bert-large, and tinybert for tests.

Why plain torch and not Hugging Face ``transformers``: nothing is downloaded, no optional package is
needed to measure, and attention is one ``torch.nn.functional.scaled_dot_product_attention`` call, so
fp16/bf16 on a GPU take PyTorch's FlashAttention / memory-efficient kernels and every engine (eager,
torch.compile, CUDA graphs, ONNX export) sees the same graph. The module is BERT's encoder exactly as
``transformers.BertModel`` builds it (post-LayerNorm, GELU, learned absolute positions, token types,
the tanh pooler), so its parameter count is BertModel's for the same configuration
(`tests/measure/models/test_bert.py` checks both, and against ``transformers`` where it is installed).

Input: int64 token ids ``(batch, seq_len)`` in ``[0, vocab)`` (`deepgap.measure.models.inputs`). The attention
mask is all ones (every token attends to every token: no padding), so SDPA is called without a mask and
may pick its fused kernels. Token types are all 0 (one segment). Output: the pooled ``[CLS]``
representation ``(batch, hidden)``, what a sentence classifier reads; the fp32 correctness check and the
ONNX ``logits`` output compare it like a CNN's logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgap.measure.models.registry import add_text_model


@dataclass(frozen=True)
class BertConfig:
    """The architecture's standard sizes (BERT paper, Table/Appendix; ``bert-base-uncased`` config.json)."""

    layers: int
    hidden: int
    heads: int
    ff: int
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def params(self, pooler: bool = True) -> int:
        """Parameter count by formula: embeddings, layers (attention, MLP, biases, LayerNorms), pooler.

        This is what ``transformers.BertModel(config).num_parameters()`` gives (bert-base:
        109,482,240 with the pooler, 108,891,648 without).
        """
        h, f = self.hidden, self.ff
        emb = (self.vocab + self.max_positions + self.type_vocab) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
        return emb + self.layers * layer + ((h * h + h) if pooler else 0)

    def flops(self, seq_len: int) -> int:
        """Inference FLOPs per sequence (2 per multiply-accumulate, bias/softmax/LayerNorm not counted).

        Per layer: the Q, K, V and output projections (4·s·h²), the MLP (2·s·h·ff), and attention's two
        matrix products QKᵀ and AV, 2·s²·h each (= 4·b·heads·s²·head_dim over a batch b); plus the pooler.
        """
        s, h = seq_len, self.hidden
        per_layer = 2 * s * (4 * h * h + 2 * h * self.ff) + 2 * 2 * s * s * h
        return self.layers * per_layer + 2 * h * h


CONFIGS = {
    "bert-base": BertConfig(layers=12, hidden=768, heads=12, ff=3072),
    "bert-large": BertConfig(layers=24, hidden=1024, heads=16, ff=4096),
    "tinybert": BertConfig(layers=2, hidden=32, heads=2, ff=64, vocab=1000, max_positions=512),
}
DEFAULT_SEQ_LEN = 128


def _build(name: str):
    from deepgap.measure.models.bert_net import build_bert

    return build_bert(CONFIGS[name])


_DESCRIPTIONS = {
    "bert-base": "BERT-base encoder (12 × 768, 12 heads, ff 3072, SDPA attention), 109.5M parameters",
    "bert-large": "BERT-large encoder (24 × 1024, 16 heads, ff 4096, SDPA attention), 335.1M parameters",
    "tinybert": "tiny BERT-shaped encoder (2 × 32, 2 heads) for tests",
}

for _name, _cfg in CONFIGS.items():
    _family = "test" if _name == "tinybert" else "bert"
    add_text_model(
        _name, _build, _cfg, _family, _DESCRIPTIONS[_name], DEFAULT_SEQ_LEN, num_classes=_cfg.hidden
    )
