"""Build a registered model (seeded random weights or a state dict) and its seeded input batch.

Why apart from the registry (`deepgap.measure.models.registry`): building needs torch, naming and checking a
model does not. The worker builds every model it measures here; the parent imports this module only where
it builds on the CPU or the meta device itself (a ``--weights`` file checked before a sweep, FLOP counts
for `deepgap compare`'s predictions), never on a GPU.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from deepgap.core.errors import UsageError
from deepgap.measure.models.inputs import is_text
from deepgap.measure.models.registry import MODELS, resolve_model
from deepgap.store.paths import check_input_path


def build_model(name: str, resolution: int, weights: str | None = None, seed: int = 0) -> torch.nn.Module:
    """Build ``name`` in eval mode, fp32, on the CPU, with seeded random weights or a state dict."""
    entry = resolve_model(name)
    torch.manual_seed(seed)
    model = entry.build(resolution)
    if weights:
        load_weights(model, name, weights)
        return model.eval()
    model.eval()
    inform_zero_layers(model, seed)
    tame_activations(model, resolution, seed)
    return model


def inform_zero_layers(model: torch.nn.Module, seed: int) -> list[str]:
    """Give a zero-initialised linear layer seeded random weights, so the outputs carry information.

    Why: torchvision's ViT initialises its classifier head to zeros (right for fine-tuning, useless for a
    check): every logit of a random-weight ViT-B/16 is 0, the correctness check has nothing to compare
    (``WRONG(relL2=0)`` on every row) and ViT got no answer. Such a layer gets weights drawn from
    N(0, 1/fan_in) (logits of the order of the features), seeded, so the model stays reproducible; its
    bias stays zero. Returns the names of the layers changed (none for a model without such a layer).
    """
    gen = torch.Generator().manual_seed(seed + 104729)
    changed = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod.weight.numel() and not bool(mod.weight.detach().any()):
            with torch.no_grad():
                w = torch.randn(mod.weight.shape, generator=gen) / math.sqrt(mod.in_features)
                mod.weight.copy_(w.to(mod.weight.dtype))
            changed.append(name)
    return changed


def build_skeleton(name: str, resolution: int) -> torch.nn.Module:
    """``name``'s architecture on the ``meta`` device, in eval mode: shapes only, no weights.

    Why: counting FLOPs and bytes (the report's roofline) needs the graph, not the numbers; building on
    the meta device skips the random initialisation and `tame_activations`' probe pass, which cost
    seconds per ResNet on the CPU.
    """
    entry = resolve_model(name)
    with torch.device("meta"):
        model = entry.build(resolution)
    return model.eval()


def load_weights(model: torch.nn.Module, name: str, weights: str) -> None:
    """Load the state dict in ``weights`` into ``model``, or a `UsageError` saying why it does not fit."""
    if not os.path.isfile(weights):
        raise UsageError(f"weights file {weights!r} does not exist", "pass a local state-dict file")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and format errors differ between torch versions
        raise UsageError(
            f"weights file {weights!r} cannot be loaded as a state dict ({type(exc).__name__})",
            "pass a file saved with torch.save(model.state_dict(), PATH)",
        ) from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UsageError(
            f"weights file {weights!r} holds a {type(state).__name__}, not a state dict of tensors",
            "pass a file saved with torch.save(model.state_dict(), PATH)",
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        first = first if len(first) < 160 else first[:160] + "…"
        raise UsageError(
            f"weights file {weights!r} does not fit model {name} ({first})",
            "pass the state dict of this model, or the model these weights belong to",
        ) from None


def check_weights(name: str, resolution: int, weights: str) -> None:
    """Load ``weights`` into ``name`` once on the CPU, before a sweep, so a bad file stops it at the start."""
    check_input_path(weights, "weights file", "pass a state-dict file (torch.save)")
    build_model(name, resolution, weights)


ACTIVATION_CEILING = 4096.0  # largest activation allowed on the probe: 16× below fp16's 65,504


def tame_activations(model: torch.nn.Module, resolution: int, seed: int) -> float:
    """Scale a random-weight network whose activations would overflow fp16; returns the factor (1: none).

    Why: fresh BatchNorm layers are the identity in eval mode, so with random weights each residual
    block adds to the activations (~1.5× per block): ResNet-101's last blocks reach ~1e5 at 224²,
    beyond fp16's 65,504, so its fp16 logits are inf and every fp16 configuration fails the
    correctness check — an artifact of random weights (trained ones stay O(1)). (Estimating the
    BatchNorm statistics instead keeps activations O(1) but makes the random network chaotic: fp16
    rounding then grows to 3–9% of the logits.) A ResNet without its classifier bias is positively
    homogeneous, so multiplying the first BatchNorm's affine parameters by a power of two scales
    every later activation by exactly that factor: the same kernels run on the same relative
    values, and every fp16 tensor stays finite. Networks already within ``ACTIVATION_CEILING`` on
    a seeded probe image are left alone; the probe runs on one thread, so the factor (and
    ``weights_fingerprint``) does not depend on the thread count.
    """
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.affine]
    if not bns:
        return 1.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed + 7919)
        peak = peak_activation(model, torch.randn(1, 3, resolution, resolution, generator=gen))
    finally:
        torch.set_num_threads(threads)
    if not math.isfinite(peak) or peak <= ACTIVATION_CEILING:
        return 1.0
    factor = 2.0 ** math.floor(math.log2(ACTIVATION_CEILING / peak))
    with torch.no_grad():
        bns[0].weight.mul_(factor)
        bns[0].bias.mul_(factor)
    return factor


def peak_activation(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Largest |value| any leaf module outputs on ``x`` (the quantity fp16 must hold)."""
    peak = 0.0

    def watch(_mod, _inp, out):
        nonlocal peak
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
            peak = max(peak, float(out.detach().abs().max()))

    hooks = [m.register_forward_hook(watch) for m in model.modules() if not list(m.children())]
    with hooks_installed(hooks), torch.no_grad():
        model(x)
    return peak


@contextmanager
def hooks_installed(hooks: Iterable[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    """Remove ``hooks`` (a module's forward or pre-forward hooks) when the block ends, raised or not.

    Why one place: an observing pass (`peak_activation`, the quant engine's calibration and kernel choice)
    must never leave a hook behind, which would run again in every later forward, the timed ones included.
    """
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (first 16 hex) over the fp32 state dict: proves configurations share weights."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def example_batch(
    model: str, batch: int, size: int, generator: torch.Generator | None = None, device: str = "cpu"
) -> torch.Tensor:
    """A seeded random batch: fp32 N(0, 1) images (b, 3, s, s), or int64 token ids (b, s) in [0, vocab).

    Image inputs are never all zero (a zero image hides wrong kernels); token ids are uniform over the
    vocabulary with no padding (attention mask all ones).
    """
    if is_text(model):
        vocab = MODELS.get(model).vocab_size
        ids = torch.randint(0, vocab, (batch, size), generator=generator, dtype=torch.int64)
        return ids.to(device)
    return torch.randn(batch, 3, size, size, generator=generator).to(device)
