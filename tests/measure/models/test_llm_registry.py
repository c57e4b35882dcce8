"""The Llama shapes in the model registry (issue 51): listed, and run by sweeps as text models (prefill).

A sweep's text-model path feeds int64 ids ``(batch, seq_len)`` and compares the output's width with
``num_classes``: the decoder's stateless forward returns the last position's logits ``(batch, vocab)``,
so a sweep times a prefill without the cache. The FLOP counter sees its attention as the full ``s²``
square (torch's rule), which `llm_cost.prefill_cost` counts causally; the test states the difference.
"""

import torch

from deepgap.measure.llm_cost import prefill_cost
from deepgap.measure.models import MODELS, resolve_model
from deepgap.measure.models.build import build_model, example_batch
from deepgap.measure.models.flops import count_flops
from deepgap.measure.models.llama_config import SHAPES


def test_shapes_are_registered_text_models():
    for name, shape in SHAPES.items():
        entry = resolve_model(name)
        assert entry.is_text and entry.vocab_size == entry.num_classes == shape.vocab
        assert entry.max_seq_len == shape.max_positions and name in MODELS.names()
        assert entry.family == ("test" if name == "llama-tiny" else "llm")
    assert "8.03B parameters" in resolve_model("llama-3.1-8b").description
    tiny = resolve_model("llama-tiny")
    assert tiny.description.endswith(f"{tiny_params() / 1e3:.3g}k parameters")  # it had read "0.00B"


def tiny_params() -> int:
    return SHAPES["llama-tiny"].params()


def test_a_sweep_builds_the_tiny_decoder_and_counts_its_prefill_flops():
    model = build_model("llama-tiny", 32, seed=1)
    x = example_batch("llama-tiny", 2, 32)
    with torch.inference_mode():
        logits = model(x)
        flops = count_flops(model, x)
    assert tuple(logits.shape) == (2, SHAPES["llama-tiny"].vocab)
    s = SHAPES["llama-tiny"]
    square_minus_causal = 4 * 2 * s.layers * s.heads * s.head_dim * (32 * 32 - 32 * 33 // 2)
    assert flops == prefill_cost(s, 2, 32).flops + square_minus_causal
