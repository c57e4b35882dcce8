"""The quant engine's attention switch (`deepgap.measure.quant.sdpa_choice`) on a CPU: the switch, the order
it sets, the cache tag, and the kernel it names. On a GPU: tests/measure/quant/test_quant_linear_gpu.py."""

import pytest
import torch
from torch.nn.attention import SDPBackend

from deepgap.core.errors import UsageError
from deepgap.measure.models.build import build_model
from deepgap.measure.quant import sdpa_choice


def test_the_switch_defaults_to_torchs_order_and_refuses_other_values(monkeypatch):
    monkeypatch.delenv(sdpa_choice.ENV, raising=False)
    assert sdpa_choice.mode() == "torch" and sdpa_choice.mode("flash") == "flash"
    monkeypatch.setenv(sdpa_choice.ENV, "cudnn")
    assert sdpa_choice.mode() == "cudnn"
    monkeypatch.setenv(sdpa_choice.ENV, "fa3")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_SDPA='fa3'.*torch, cudnn, flash, efficient"):
        sdpa_choice.mode()
    with pytest.raises(ValueError):
        sdpa_choice.mode("fa3")


def test_each_mode_orders_the_backends_and_tags_the_compile_caches_only_inside():
    before = torch._C._get_sdp_priority_order()
    with sdpa_choice.backends("cudnn"):
        assert torch._C._get_sdp_priority_order()[0] == SDPBackend.CUDNN_ATTENTION.value
        assert torch.compiler.config.cache_key_tag == "deepgap-sdpa=cudnn"
    with sdpa_choice.backends("efficient"):
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    with sdpa_choice.backends("torch"):
        assert torch._C._get_sdp_priority_order() == before and torch.backends.cuda.flash_sdp_enabled()
        assert torch.compiler.config.cache_key_tag == "deepgap-sdpa=torch"
    assert torch._C._get_sdp_priority_order() == before and torch.compiler.config.cache_key_tag == ""


@pytest.mark.parametrize("model", ["tinybert", "vit_b_16"])
def test_chosen_names_what_sdpa_dispatches_each_attention_call_to(model):
    """On a CPU SDPA takes its own flash kernel in cuDNN's order (cuDNN is CUDA only): what ran, not what was
    asked; with only the memory-efficient backend allowed, which a CPU lacks, the probe fails as SDPA would."""
    net = build_model(model, 32).eval()
    x = torch.randint(0, 100, (2, 32)) if model == "tinybert" else torch.randn(1, 3, 32, 32)
    if model == "vit_b_16":
        from deepgap.measure.models.attention import unfuse_attention

        unfuse_attention(net)  # the engine's ViT: one SDPA call a layer
    assert sdpa_choice.chosen(net, x, "cudnn") == sdpa_choice.chosen(net, x, "torch") == ["FlashAttention-2"]
    with pytest.raises(RuntimeError, match="No viable backend"):
        sdpa_choice.chosen(net, x, "efficient")
