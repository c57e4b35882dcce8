"""Llama-architecture decoders (issue 51): build one from a named shape or a local HF folder; the registry rows.

`llama_net.build_llama("llama-3.1-8b")` gives the decoder with seeded random weights; ``build_llama(path)``
reads the shape from ``path`` (a ``config.json`` or its folder) and, with ``weights=True``, the
folder's ``*.safetensors`` (`llama_weights`). ``device="meta"`` builds shapes only (milliseconds for
the 8B model: the parameter-count test's way). This module is torch-free: the registry rows only.

The registry rows make `deepgap list models` show the shapes. They are text models (token-id input,
a sequence-length axis), so a sweep that names one times the stateless forward over the prompt, a
prefill without the cache, and checks its next-token logits against fp32. Decode (TTFT, TPOT,
tokens/s) is measured by `deepgap.measure.llm_timing` and ``benchmarks/llm_decode.py``, not yet by
sweeps (docs/llm.md says what is missing).
"""

from __future__ import annotations

from deepgap.measure.models.llama_config import SHAPES
from deepgap.measure.models.registry import add_text_model

DEFAULT_SEQ_LEN = 128


def _build(name: str):
    from deepgap.measure.models.llama_net import build_llama

    return build_llama(name)


for _name, _shape in SHAPES.items():
    _family = "test" if _name == "llama-tiny" else "llm"
    add_text_model(
        _name, _build, _shape, _family, _shape.describe(), min(DEFAULT_SEQ_LEN, _shape.max_positions)
    )
