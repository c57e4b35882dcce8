"""BERT-class encoders (issue 38): parameter and FLOP counts against the reference, token inputs, the engines.

Parameter counts are those of ``transformers.BertModel`` *with* its pooler (embeddings incl. token types
and their LayerNorm, 12/24 encoder layers, the tanh pooler): 109,482,240 for bert-base-uncased and
335,141,888 for bert-large-uncased, as published (and as ``BertModel(config).num_parameters()`` gives).
BertModel's own count for the same config, and its outputs, are compared in test_bert_hf.py.
Big models are built on the meta device: shapes only, milliseconds.
"""

import pytest
import torch

from deepgap.measure.models import resolve_model
from deepgap.measure.models.bert import CONFIGS
from deepgap.measure.models.bert_net import build_bert
from deepgap.measure.models.build import build_model, example_batch
from deepgap.measure.models.flops import count_flops, op_counter

PUBLISHED_PARAMS = {"bert-base": 109_482_240, "bert-large": 335_141_888}  # BertModel incl. pooler
POOLER = {"bert-base": 768 * 768 + 768, "bert-large": 1024 * 1024 + 1024}


def _meta(name):
    with torch.device("meta"):
        return build_bert(CONFIGS[name])


@pytest.mark.parametrize("name", ["bert-base", "bert-large"])
def test_parameter_count_is_bertmodels(name):
    n = sum(p.numel() for p in _meta(name).parameters())
    assert n == PUBLISHED_PARAMS[name] == CONFIGS[name].params()
    assert CONFIGS[name].params(pooler=False) == n - POOLER[name]
    cfg = CONFIGS[name]
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.ff, cfg.vocab, cfg.max_positions) == {
        "bert-base": (12, 768, 12, 3072, 30522, 512),
        "bert-large": (24, 1024, 16, 4096, 30522, 512),
    }[name]


def test_bert_base_flops_at_seq_128_include_attention():
    """The one FLOP counter on bert-base at sequence 128 equals the reference formula, attention included."""
    s, b = 128, 2
    cfg = CONFIGS["bert-base"]
    counter = op_counter()
    with torch.no_grad(), counter:
        _meta("bert-base")(torch.zeros(b, s, dtype=torch.int64, device="meta"))
    total = sum(r.flops for r in counter.records)
    h, f, n = cfg.hidden, cfg.ff, cfg.layers
    gemms = n * 2 * b * s * (4 * h * h + 2 * h * f) + 2 * b * h * h  # projections, MLP, pooler
    attention = n * 4 * b * cfg.heads * s * s * cfg.head_dim  # QKᵀ and AV: 4·b·h·s²·d per layer
    assert attention == 4 * 2 * 12 * 128 * 128 * 64 * 12  # 1.21 GFLOP: the part a GEMM-only count misses
    assert total == gemms + attention == b * cfg.flops(s) == 2 * 22_348_431_360


def test_cpu_sdpa_kernel_is_counted_as_attention():
    """On a CPU, SDPA runs as ``_scaled_dot_product_flash_attention_for_cpu``, which torch's FlopCounterMode
    has no formula for; deepgap's counter gives it the CUDA kernel's, so tinybert's count is the formula's."""
    m = build_model("tinybert", 64)
    counter = op_counter()
    with torch.inference_mode(), counter:
        m(example_batch("tinybert", 3, 64))
    attn = [r for r in counter.records if "attention" in r.op]
    cfg = CONFIGS["tinybert"]
    per_call = 4 * 3 * cfg.heads * 64 * 64 * cfg.head_dim  # 4·b·h·s²·d
    assert len(attn) == cfg.layers and all(r.flops == per_call for r in attn)
    with torch.inference_mode():
        assert count_flops(m, example_batch("tinybert", 1, 64)) == cfg.flops(64)


def test_token_inputs_are_seeded_int64_ids_in_the_vocabulary():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = example_batch("tinybert", 4, 16, g1), example_batch("tinybert", 4, 16, g2)
    assert a.dtype == torch.int64 and tuple(a.shape) == (4, 16) and torch.equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < resolve_model("tinybert").vocab_size
    assert example_batch("tinycnn", 2, 32).dtype == torch.float32  # image models unchanged
    assert resolve_model("bert-base").is_text and not resolve_model("vit_b_16").is_text


def test_weights_file_loads_into_the_encoder(tmp_path):
    m = build_model("tinybert", 16, seed=3)
    path = tmp_path / "w.pt"
    torch.save(m.state_dict(), path)
    again = build_model("tinybert", 16, weights=str(path), seed=99)
    x = example_batch("tinybert", 2, 16)
    with torch.inference_mode():
        assert torch.equal(m(x), again(x))


def test_roofline_cost_of_a_text_model_counts_attention_and_token_inputs():
    from deepgap.roofline.flops import model_cost

    cost = model_cost("tinybert", 64)
    cfg = CONFIGS["tinybert"]
    assert cost.flops_per_image == cfg.flops(64)  # attention's 4·s²·h per layer included
    assert cost.input_elements_per_image == 64 and cost.output_elements_per_image == cfg.hidden
    # the meta count decomposes SDPA into matmuls: its traffic includes the s×s scores (an upper bound)
    assert cost.traffic_elements_per_image > cfg.layers * cfg.heads * 64 * 64
