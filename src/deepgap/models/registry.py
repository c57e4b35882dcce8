"""The model registry and the build path shared by every source (torchvision, timm, tiny, faults)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deepgap.errors import UsageError
from deepgap.registry import Registry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ModelEntry:
    """How to build one model. ``build(resolution)`` returns an ``nn.Module`` on the CPU in fp32."""

    build: Callable[[int], torch.nn.Module]
    family: str
    default_resolution: int = 224
    description: str = ""
    hidden: bool = False  # test/fault-injection models, listed only with --all
    num_classes: int = 1000


MODELS: Registry[ModelEntry] = Registry("model")
TIMM_PREFIX = "timm:"


def resolve_model(name: str) -> ModelEntry:
    """Registry entry for ``name``; ``timm:<name>`` builds through timm when it is installed."""
    if name.startswith(TIMM_PREFIX):
        timm_name = name[len(TIMM_PREFIX) :]
        try:
            import timm
        except ImportError:
            raise UsageError(f"model {name!r} needs timm, which is not installed", "pip install timm") from None
        if timm_name not in timm.list_models():
            raise UsageError(f"timm has no model {timm_name!r}", "see timm.list_models() for names")

        def build(resolution: int) -> torch.nn.Module:
            return timm.create_model(timm_name, pretrained=False)

        return ModelEntry(build=build, family="timm", description=f"timm {timm_name}")
    return MODELS.get(name)


def build_model(name: str, resolution: int, weights: str | None = None, seed: int = 0) -> torch.nn.Module:
    """Build ``name`` in eval mode, fp32, on the CPU, with seeded random weights or a state dict."""
    import torch

    entry = resolve_model(name)
    torch.manual_seed(seed)
    model = entry.build(resolution)
    if weights:
        if not os.path.isfile(weights):
            raise UsageError(f"weights file {weights!r} does not exist", "pass a local state-dict file")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        model.load_state_dict(state)
    return model.eval()


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (first 16 hex) over the fp32 state dict: proves configurations share weights."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
