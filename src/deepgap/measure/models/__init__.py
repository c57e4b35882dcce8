"""Model registry: name → how to build an ``nn.Module`` with deterministic random weights.

Every builder seeds torch before constructing the module, so FP32, FP16, INT8 … of one model all
start from *identical* weights (the paper used different weight versions per precision).
``--weights FILE`` loads a local state dict instead. Building is `deepgap.measure.models.build` (torch at its
top); this package and the registry stay torch-free.
"""

from __future__ import annotations

from deepgap.measure.models.registry import MODELS, ModelEntry, resolve_model

# Importing the modules registers their entries.
from deepgap.measure.models import bert, faults, llama, tiny, torchvision_models  # noqa: F401, E402  isort: skip

__all__ = ["MODELS", "ModelEntry", "resolve_model"]
