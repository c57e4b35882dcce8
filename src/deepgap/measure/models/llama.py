"""Llama-architecture decoders (issue 51): build one from a named shape or a local HF folder; the registry rows.

``build_llama("llama-3.1-8b")`` gives the decoder with seeded random weights; ``build_llama(path)``
reads the shape from ``path`` (a ``config.json`` or its folder) and, with ``weights=True``, the
folder's ``*.safetensors`` (`llama_weights`). ``device="meta"`` builds shapes only (milliseconds for
the 8B model: the parameter-count test's way). torch is imported only when a model is built.

The registry rows make `deepgap list models` show the shapes. They are text models (token-id input,
a sequence-length axis), so a sweep that names one times the stateless forward over the prompt, a
prefill without the cache, and checks its next-token logits against fp32. Decode (TTFT, TPOT,
tokens/s) is measured by `deepgap.measure.llm_timing` and ``benchmarks/llm_decode.py``, not yet by
sweeps (docs/llm.md says what is missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepgap.measure.models.llama_config import SHAPES, LlamaShape, shape_of
from deepgap.measure.models.registry import MODELS, ModelEntry

if TYPE_CHECKING:
    import torch

DEFAULT_SEQ_LEN = 128


def build_llama(
    source: str | LlamaShape, seed: int = 0, weights: bool = False, device: str | None = None
) -> torch.nn.Module:
    """The decoder for a named shape, a `LlamaShape` or a local HF folder/config.json, in fp32 eval mode.

    ``weights``: load ``*.safetensors`` from ``source``'s folder (HF names); otherwise seeded random
    weights. ``device``: where to build (``"meta"``: shapes only, nothing allocated).
    """
    import os

    import torch

    from deepgap.core.errors import UsageError
    from deepgap.measure.models.llama_net import Llama

    shape = source if isinstance(source, LlamaShape) else shape_of(source)
    if weights and (not isinstance(source, str) or source in SHAPES):
        raise UsageError("weights come from a checkpoint folder", "pass the folder holding config.json")
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = Llama(shape)
    if weights:
        from deepgap.measure.models.llama_weights import load_hf_weights

        assert isinstance(source, str)
        load_hf_weights(model, source if os.path.isdir(source) else os.path.dirname(source) or ".")
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters as stored (a tied head counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _builder(name: str):
    def build(resolution: int):
        return build_llama(name)

    return build


for _name, _shape in SHAPES.items():
    MODELS.add(
        _name,
        ModelEntry(
            build=_builder(_name),
            family="test" if _name == "llama-tiny" else "llm",
            default_resolution=min(DEFAULT_SEQ_LEN, _shape.max_positions),
            description=_shape.describe(),
            num_classes=_shape.vocab,
            vocab_size=_shape.vocab,
            max_seq_len=_shape.max_positions,
        ),
    )
