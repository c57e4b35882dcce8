"""deepgap's BERT encoder against ``transformers.BertModel`` with the same weights (issue 50's HF cross-check).

The parameter counts of bert-base and bert-large, and the outputs: full-length sequences, and a batch of
mixed lengths that BertModel reads with its attention mask, which deepgap runs packed (padding removed) and
padded (keys masked, `deepgap.measure.models.text_batch`). An independent implementation of the same
arithmetic, so the packing and the mask are checked against what the model's users run, not against itself.
"""

from __future__ import annotations

import pytest
import torch

from deepgap.measure.models.bert import CONFIGS
from deepgap.measure.models.bert_net import build_bert
from deepgap.measure.models.build import build_model
from deepgap.measure.models.text_batch import TextBatch

transformers = pytest.importorskip("transformers")  # in the test extras: installed wherever the suite runs


def _hf_config(name: str):
    """BertModel's config of deepgap's shape ``name``."""
    c = CONFIGS[name]
    return transformers.BertConfig(
        vocab_size=c.vocab,
        hidden_size=c.hidden,
        num_hidden_layers=c.layers,
        num_attention_heads=c.heads,
        intermediate_size=c.ff,
        max_position_embeddings=c.max_positions,
        type_vocab_size=c.type_vocab,
        layer_norm_eps=c.layer_norm_eps,
        hidden_act="gelu",
        attn_implementation="eager",
    )


def test_parameter_counts_are_bertmodels():
    for name in ("bert-base", "bert-large"):
        with torch.device("meta"):
            ref = transformers.BertModel(_hf_config(name), add_pooling_layer=True)
            ours = build_bert(CONFIGS[name])
        assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in ours.parameters())


def _pair(name: str = "tinybert"):
    """(deepgap's model, BertModel) with BertModel's random weights copied into deepgap's."""
    c, cfg = CONFIGS[name], _hf_config(name)
    torch.manual_seed(3)
    hf = transformers.BertModel(cfg, add_pooling_layer=True).eval()
    sd = hf.state_dict()
    ours = build_model(name, 64, None, 0).eval()
    mapped = {
        "word.weight": sd["embeddings.word_embeddings.weight"],
        "position.weight": sd["embeddings.position_embeddings.weight"],
        "token_type.weight": sd["embeddings.token_type_embeddings.weight"],
        "ln.weight": sd["embeddings.LayerNorm.weight"],
        "ln.bias": sd["embeddings.LayerNorm.bias"],
        "pooler.weight": sd["pooler.dense.weight"],
        "pooler.bias": sd["pooler.dense.bias"],
    }
    for i in range(c.layers):
        h = f"encoder.layer.{i}."
        att = h + "attention.self."
        for kind in ("weight", "bias"):
            mapped[f"layers.{i}.qkv.{kind}"] = torch.cat(
                [sd[f"{att}{p}.{kind}"] for p in ("query", "key", "value")]
            )
            for ours_name, theirs in (
                ("out", "attention.output.dense"),
                ("ln1", "attention.output.LayerNorm"),
                ("ff1", "intermediate.dense"),
                ("ff2", "output.dense"),
                ("ln2", "output.LayerNorm"),
            ):
                mapped[f"layers.{i}.{ours_name}.{kind}"] = sd[f"{h}{theirs}.{kind}"]
    ours.load_state_dict(mapped, strict=True)
    return ours, hf


def test_full_sequences_match_bertmodel():
    ours, hf = _pair()
    ids = torch.randint(1, 1000, (3, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids), hf(ids).pooler_output, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_mixed_lengths_match_bertmodel_with_its_attention_mask(mode):
    ours, hf = _pair()
    batch = TextBatch(mode, (9, 64, 1, 33))
    ids = batch.ids(torch.randint(1, 1000, (4, 64), generator=torch.Generator().manual_seed(1)))
    with torch.inference_mode():
        theirs = hf(ids, attention_mask=batch.mask.long()).pooler_output
        ours.set_text_batch(batch)
        torch.testing.assert_close(ours(ids), theirs, rtol=1e-5, atol=1e-5)
