"""Static activation ranges: run the folded fp32 network on N seeded inputs, keep each tensor's range.

Why static: a scale computed per batch at run time costs a reduction pass over every activation
and breaks the fused epilogue (it must know the output scale before it writes). Why cached: the
pass over N images costs seconds at 224², and every batch size and precision of a sweep shares it
(the stored value is the range, amax; int8 divides it by 127, fp8 by 448). The cache key names
everything that changes the answer: model, resolution, weights fingerprint, N, seed, method.

Inputs are standard-normal images, the distribution deepgap's benchmark feeds (``worker.inputs_for``),
unless the sweep has a labelled dataset: then its calibration split (``images``; ``key.data`` is its
fingerprint, so the cache never mixes the two).

Methods: 'max' (largest |x| seen) or 'pXX.XX' (that percentile of |x| per batch, then the largest
over batches), which clips rare outliers to spend the 8 bits on the bulk of the distribution.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from deepgap.measure.quant.fold import Graph

CACHE_VERSION = 1
DEFAULT_METHOD = "p99.99"
SAMPLE_LIMIT = 1 << 22  # elements per tensor and batch that enter a percentile


def cache_dir() -> Path:
    """The cache directory of deepgap: ``$DEEPGAP_CACHE`` or ``~/.cache/deepgap``."""
    return Path(os.environ.get("DEEPGAP_CACHE") or Path.home() / ".cache" / "deepgap")


@dataclass(frozen=True)
class CalibrationKey:
    """Everything that determines the calibrated ranges."""

    model: str
    resolution: int
    weights_sha: str
    n_images: int = 32
    seed: int = 0
    method: str = DEFAULT_METHOD
    data: str = (
        "synthetic"  # the calibration data: "synthetic" (seeded N(0,1)) or a dataset split's fingerprint
    )

    def digest(self) -> str:
        """Stable 16-hex-digit hash of the key (the cache file's name)."""
        text = json.dumps({**asdict(self), "version": CACHE_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def path(self) -> Path:
        """Cache file of this key."""
        return cache_dir() / "quant" / f"calib-{self.digest()}.json"


def calibration_images(n: int, resolution: int, seed: int) -> torch.Tensor:
    """``n`` standard-normal RGB images (seeded, independent of the benchmark's inputs)."""
    g = torch.Generator().manual_seed(10_007 + seed)
    return torch.randn(n, 3, resolution, resolution, generator=g)


def _stat(t: torch.Tensor, method: str) -> float:
    a = t.detach().abs().flatten().float()
    if method == "max":
        return float(a.max())
    if not method.startswith("p"):
        raise ValueError(f"calibration method must be 'max' or 'pNN.NN'; got {method!r}")
    q = float(method[1:]) / 100.0
    if not 0.0 < q <= 1.0:
        raise ValueError(f"percentile out of range in {method!r}")
    if a.numel() > SAMPLE_LIMIT:
        g = torch.Generator(device=a.device).manual_seed(0)
        a = a[torch.randint(0, a.numel(), (SAMPLE_LIMIT,), generator=g, device=a.device)]
    k = max(1, min(a.numel(), int(round(q * a.numel()))))
    return float(a.kthvalue(k).values)


def collect_amax(
    graph: Graph,
    images: torch.Tensor,
    device: str = "cpu",
    batch_size: int = 16,
    method: str = DEFAULT_METHOD,
) -> dict[str, float]:
    """Range of the input and of every tensor of ``graph`` over ``images`` (fp32, TF32 off): {name: amax}."""
    from deepgap.measure.quant.fold import run_float

    amax: dict[str, float] = {}

    def observe(name: str, t: torch.Tensor) -> None:
        amax[name] = max(amax.get(name, 0.0), _stat(t, method))

    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            for i in range(0, images.shape[0], batch_size):
                chunk = images[i : i + batch_size].to(device)
                observe(graph.input, chunk)  # the image's own range: the int8 stem's input scale
                run_float(graph, chunk, observe)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    return {k: (v if v > 0 else 1e-8) for k, v in amax.items()}


def calibrate(
    graph: Graph,
    key: CalibrationKey,
    device: str = "cpu",
    use_cache: bool = True,
    images: torch.Tensor | None = None,
) -> tuple[dict, bool]:
    """Activation ranges for ``graph``, from the cache when present; returns (amax, came_from_cache).

    ``images``: the user's calibration images (accuracy mode), which ``key.data`` must name; None: synthetic.

    A corrupt or mismatched cache file is ignored and rewritten.
    """
    path = key.path()
    # the input's range too: a cache written before it was kept is redone
    names = {graph.input, *graph.tensors()}
    if use_cache and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == asdict(key) and names <= set(data["amax"]):
                return {k: float(v) for k, v in data["amax"].items()}, True
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if images is None:
        if key.data != "synthetic":
            raise ValueError(f"calibration key names data {key.data!r} but no images were given")
        images = calibration_images(key.n_images, key.resolution, key.seed)
    amax = collect_amax(graph, images, device, method=key.method)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": asdict(key), "version": CACHE_VERSION, "amax": amax}, indent=1))
        tmp.replace(path)
    return amax, False
