"""A decoder's random weights: drawn once, in chunks spread over threads, the same on any thread count."""

import dataclasses

import pytest
import torch

from deepgap.measure.models import llama_init
from deepgap.measure.models.llama_config import SHAPES
from deepgap.measure.models.llama_net import build_llama

TINY = SHAPES["llama-tiny"]


def _equal(a, b) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_the_draw_does_not_depend_on_threads_or_chunks(monkeypatch):
    monkeypatch.setattr(llama_init, "CHUNK", 1000)  # several chunks a weight: the chunks' own seeds matter
    one = build_llama(TINY, seed=3)
    model = build_llama(TINY, seed=3, device="meta").to_empty(device="cpu")
    llama_init.init_weights(model, 3, threads=4)
    assert _equal(one, model)
    assert not _equal(one, build_llama(TINY, seed=4))


def test_the_weights_keep_each_layer_order_one():
    m = build_llama(dataclasses.replace(TINY, hidden=256, intermediate=512, vocab=1024), seed=0)
    assert m.embed_tokens.weight.std().item() == pytest.approx(1.0, rel=0.05)
    for name, p in m.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), name  # the RMSNorms start as the identity
        elif p is not m.embed_tokens.weight:
            assert p.std().item() == pytest.approx(p.shape[1] ** -0.5, rel=0.1), name
    # no chunk repeats another: each has its own generator
    w = m.layers[0].gate_up_proj.weight
    assert not torch.equal(w[: w.shape[0] // 2], w[w.shape[0] // 2 :])


def test_nothing_is_drawn_at_construction(monkeypatch):
    """Why: nn.Linear's own Kaiming draw, then ours, drew the 8B shape's weights twice on one CPU core."""

    def refuse(tensor, *args, **kwargs):
        assert tensor.is_meta, (
            "a weight drawn by torch's initialisation"
        )  # on the meta device nothing is drawn
        return tensor

    for name in ("kaiming_uniform_", "uniform_", "normal_"):
        monkeypatch.setattr(torch.nn.init, name, refuse)
    build_llama(TINY, seed=0)


def test_a_tied_head_is_the_embedding():
    m = build_llama(dataclasses.replace(TINY, tied=True), seed=0)
    assert m.lm_head.weight is m.embed_tokens.weight
    assert m.embed_tokens.weight.std().item() == pytest.approx(1.0, rel=0.1)  # drawn once, as the embedding


def test_a_meta_build_allocates_nothing_and_moves():
    m = build_llama(TINY, device="meta")
    assert all(p.is_meta for p in m.parameters()) and not m.inv_freq.is_meta
