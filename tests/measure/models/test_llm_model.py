"""The Llama decoder (issue 51) against transformers' LlamaForCausalLM with the same weights, and its counts.

The tiny shape has GQA (4 query heads on 2 KV heads), untied embeddings and Llama-3 RoPE scaling whose
original context (64) puts its frequencies in all three regimes (kept, smoothed, divided), so the
logits check covers every part of the architecture. Parameter counts of the named shapes are checked
on the meta device (nothing allocated) against the published totals and a formula written out here.
"""

import importlib.util
import json
import math

import pytest
import torch

from deepgap.measure.llm_timing import generate, prompts
from deepgap.measure.models.llama_config import SHAPES, inv_frequencies, shape_of
from deepgap.measure.models.llama_net import build_llama
from deepgap.measure.models.llama_weights import to_hf

# Checked, not imported: importing transformers costs ~1.7 CPU-s, which every xdist worker paid at collection
# although one of them runs this file. The tests that compare with it import it (`_hf`).
if importlib.util.find_spec("transformers") is None:
    pytest.skip("could not import 'transformers': No module named 'transformers'", allow_module_level=True)
TINY = SHAPES["llama-tiny"]


def _hf():
    import transformers

    return transformers


def _hf_twin(model):
    """HF's LlamaForCausalLM from the same shape, holding ``model``'s weights."""
    shape = model.shape
    transformers = _hf()
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape.hf_dict())).eval()
    missing, unexpected = ref.load_state_dict(to_hf(model.state_dict(), shape), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    return ref


def _rel_l2(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def pair():
    model = build_llama("llama-tiny", seed=3)
    return model, _hf_twin(model)


def test_prefill_logits_match_transformers(pair):
    model, ref = pair
    ids = prompts(TINY.vocab, 2, 12, seed=1)
    with torch.inference_mode():
        want = ref(ids).logits
        model.setup_cache(2, 32)
        assert _rel_l2(model.prefill(ids, all_logits=True), want) < 1e-4
        assert _rel_l2(model(ids, all_logits=True), want) < 1e-4  # the stateless forward a sweep times
        assert torch.allclose(model(ids), model(ids, all_logits=True)[:, -1], rtol=0, atol=1e-5)


def test_greedy_decode_through_the_static_cache_equals_hf_generate(pair):
    model, ref = pair
    ids = prompts(TINY.vocab, 2, 10, seed=2)
    ours = generate(model, ids, 16)
    with torch.inference_mode():
        theirs = ref.generate(
            ids, do_sample=False, max_new_tokens=16, min_new_tokens=16, eos_token_id=None, pad_token_id=0
        )[:, 10:]
    assert torch.equal(ours, theirs)
    assert len(set(ours[0].tolist())) > 3  # the random model does not collapse to one token


def test_safetensors_checkpoint_folder_loads_into_the_decoder(pair, tmp_path):
    """A folder as HF writes it (config.json + model.safetensors) builds the same logits as HF's model."""
    _, ref = pair
    ref.save_pretrained(tmp_path)
    loaded = build_llama(str(tmp_path), weights=True)
    assert loaded.shape == TINY
    ids = prompts(TINY.vocab, 1, 8, seed=4)
    with torch.inference_mode():
        assert _rel_l2(loaded(ids, all_logits=True), ref(ids).logits) < 1e-6


def test_tied_shape_and_config_json_round_trip(tmp_path):
    """A tied shape (as Llama-3.2-1B's) written as config.json reads back equal and matches HF's logits."""
    shape = shape_of("llama-tiny").__class__(**{**TINY.__dict__, "tied": True})
    (tmp_path / "config.json").write_text(json.dumps(shape.hf_dict()))
    assert shape_of(str(tmp_path)) == shape == shape_of(str(tmp_path / "config.json"))
    model = build_llama(str(tmp_path), seed=5)
    assert model.lm_head.weight is model.embed_tokens.weight
    ids = prompts(shape.vocab, 1, 6, seed=5)
    with torch.inference_mode():
        assert _rel_l2(model(ids, all_logits=True), _hf_twin(model)(ids).logits) < 1e-4


def test_rope_scaling_frequencies_are_hfs_in_all_three_regimes():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers = _hf()

    cfg = transformers.LlamaConfig(**TINY.hf_dict())
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = torch.tensor(inv_frequencies(TINY), dtype=torch.float64)
    assert torch.allclose(ours.float(), want, rtol=1e-6, atol=0)
    plain = [TINY.rope_theta ** (-i / TINY.head_dim) for i in range(0, TINY.head_dim, 2)]
    ratio = ours / torch.tensor(plain, dtype=torch.float64)
    kept = torch.isclose(ratio, torch.ones_like(ratio))
    divided = torch.isclose(ratio, torch.full_like(ratio, 1 / TINY.rope_scaling.factor))
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # and some smoothed between


# Hand formula of a Llama checkpoint's parameters, written apart from LlamaShape.params:
# embedding V·h; per layer Q (h·h), K and V (h·kv·d each), O (h·h), MLP 3·h·I, two norms 2h; final norm h;
# the head V·h unless tied.
HAND = {
    "llama-3.2-1b": 128256 * 2048
    + 16 * (2 * 2048 * 2048 + 2 * 2048 * 8 * 64 + 3 * 2048 * 8192 + 2 * 2048)
    + 2048,
    "llama-3.1-8b": 2 * 128256 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 4096 * 8 * 128 + 3 * 4096 * 14336 + 2 * 4096)
    + 4096,
}


@pytest.mark.parametrize(("name", "published"), [("llama-3.2-1b", 1.24e9), ("llama-3.1-8b", 8.03e9)])
def test_named_shapes_count_their_published_parameters_on_meta(name, published):
    model = build_llama(name, device="meta")
    n = sum(p.numel() for p in model.parameters())  # a tied head is one Parameter, counted once
    assert n == SHAPES[name].params() == HAND[name]
    assert math.isclose(n, published, rel_tol=5e-3)
    assert n == {"llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248}[name]
    transformers = _hf()
    with torch.device("meta"):
        ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPES[name].hf_dict()))
    assert sum(p.numel() for p in ref.parameters()) == n


def test_named_shapes_carry_the_published_config_values():
    dims = {
        n: (s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.vocab, s.tied)
        for n, s in SHAPES.items()
    }
    assert dims["llama-3.2-1b"] == (16, 2048, 8192, 32, 8, 128256, True)
    assert dims["llama-3.1-8b"] == (32, 4096, 14336, 32, 8, 128256, False)
    for name in ("llama-3.2-1b", "llama-3.1-8b"):
        s = SHAPES[name]
        assert (s.rope_theta, s.head_dim, s.max_positions, s.rms_eps) == (
            500000.0,
            s.hidden // 32,
            131072,
            1e-5,
        )
        assert s.rope_scaling.factor == {"llama-3.2-1b": 32.0, "llama-3.1-8b": 8.0}[name]


def test_one_token_attention_takes_a_gpu_kernels_output_layout(monkeypatch):
    """A GPU SDPA kernel returns (b, heads, s, d) laid out as (b, s, heads, d); folding the grouped query
    heads back must not assume a contiguous output (every GPU decode step failed on a `view` here)."""
    from torch.nn import functional as F  # noqa: N812

    from deepgap.measure.models import llama_cache

    real = F.scaled_dot_product_attention

    def gpu_like(*a, **k):
        return real(*a, **k).transpose(1, 2).contiguous().transpose(1, 2)  # same values, GPU strides

    q, kv = torch.randn(2, 8, 1, 4), torch.randn(2, 2, 5, 4)
    want = llama_cache.one_token(q, kv, kv, None)
    monkeypatch.setattr(llama_cache.F, "scaled_dot_product_attention", gpu_like)
    torch.testing.assert_close(llama_cache.one_token(q, kv, kv, None), want)
