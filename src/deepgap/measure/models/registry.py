"""The model registry: every source's entries (torchvision, timm, tiny, faults, BERT, Llama), by name.

Torch-free, so the parent validates a sweep's models against it; `deepgap.measure.models.build` builds one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.registry import Registry


@dataclass(frozen=True)
class ModelEntry:
    """How to build one model. ``build(resolution)`` returns an ``nn.Module`` on the CPU in fp32."""

    build: Callable[[int], Any]  # returns a torch nn.Module
    family: str
    default_resolution: int = 224
    description: str = ""
    hidden: bool = False  # test/fault-injection models, listed only with --all
    num_classes: int = 1000  # width of the output a row of the correctness check compares
    vocab_size: int = 0  # a text model's token vocabulary (its inputs are int64 ids); 0: an image model
    max_seq_len: int = 0  # a text model's longest sequence (its learned positions)

    @property
    def is_text(self) -> bool:
        """Whether the model reads token ids (batch, seq_len) rather than images (batch, 3, R, R)."""
        return self.vocab_size > 0


MODELS: Registry[ModelEntry] = Registry("model")


def add_text_model(
    name: str,
    build: Callable[[str], Any],
    shape: Any,
    family: str,
    description: str,
    seq_len: int,
    num_classes: int | None = None,
) -> None:
    """Register a text model (token ids in, BERT's and Llama's): ``build(name)`` builds it.

    ``shape`` (a `BertConfig`, a `LlamaShape`) bounds its inputs by its ``vocab`` and ``max_positions``;
    ``seq_len`` is its default sequence length, ``num_classes`` its output's width (default: the vocab).
    """
    entry = ModelEntry(
        build=lambda resolution: build(name),
        family=family,
        default_resolution=seq_len,
        description=description,
        num_classes=num_classes or shape.vocab,
        vocab_size=shape.vocab,
        max_seq_len=shape.max_positions,
    )
    MODELS.add(name, entry)


TIMM_PREFIX = "timm:"


def resolve_model(name: str) -> ModelEntry:
    """Registry entry for ``name``; ``timm:<name>`` builds through timm when it is installed."""
    if name.startswith(TIMM_PREFIX):
        timm_name = name[len(TIMM_PREFIX) :]
        try:
            import timm
        except ImportError:
            raise UsageError(
                f"model {name!r} needs timm, which is not installed", "pip install timm"
            ) from None
        if timm_name not in timm.list_models():
            raise UsageError(f"timm has no model {timm_name!r}", "see timm.list_models() for names")

        def build(resolution: int) -> Any:
            return timm.create_model(timm_name, pretrained=False)

        return ModelEntry(build=build, family="timm", description=f"timm {timm_name}")
    if name not in MODELS:
        from deepgap.measure.models.llama_config import is_config_path, shape_of

        if is_config_path(name):  # a local HF Llama config.json: its decoder, random weights (issue 51)
            shape = shape_of(name)
            return ModelEntry(
                build=lambda resolution: _build_llama(name),
                family="llm",
                default_resolution=min(128, shape.max_positions),
                description=shape.describe(),
                num_classes=shape.vocab,
                vocab_size=shape.vocab,
                max_seq_len=shape.max_positions,
            )
    return MODELS.get(name)


def _build_llama(source: str) -> Any:
    from deepgap.measure.models.llama_net import build_llama

    return build_llama(source)
