"""A persistent cache of the per-layer tile choice, keyed by device, library versions and layer shape.

Why: choosing a tile per layer compiles and times every candidate (several Triton kernels per layer)
and times the fp16 path too. In a fresh worker process that is most of the quant engine's set-up
(`benchmarks/quant_build_time.py`), and the default sweep starts a worker per sweep, so every sweep
paid it again. The choice depends only on the GPU, the libraries that compile and run the kernel, and
the layer's GEMM shape and formats, so it is cached on disk under those keys and reused.

What a hit still does: the cached kernel runs the same exact self-check as a tuned one and is timed
again (one timing, not one per candidate), so the per-layer table keeps measured quantized times; only
the fp16 path's time (which decides 'q' vs 'fp16') comes from the cache, and every such layer says so
(``LayerTiming.from_cache``). A hit whose tile is no longer a candidate, or whose self-check fails, is
tuned again. ``QuantOptions.use_cache=False`` (as for the calibration cache) tunes everything.

One JSON file per (device, versions): ``<cache>/quant/tune-<digest>.json``, written atomically; two
processes writing at once lose one update at worst, which costs a re-tune, never a wrong answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deepgap.measure.quant.calibrate import cache_dir
from deepgap.measure.quant.tiles import TileConfig, gemm_mode, small_batch_mode, small_batch_offered

FORMAT_VERSION = 1


@dataclass(frozen=True)
class LayerShape:
    """What a layer's tile choice depends on besides the device: its GEMM and its tensor formats."""

    qfmt: str
    m: int  # output pixels × batch (GEMM rows)
    n: int  # output channels
    c: int  # input channels
    kernel_size: int
    stride: int
    padding: int
    in_fmt: str
    out_fmt: str
    res_fmt: str | None
    relu: bool

    def key(self) -> str:
        """A stable text key."""
        return "|".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())


@dataclass(frozen=True)
class Choice:
    """A cached choice: the backend, its tile (None for the torch path) and the fp16 path's time."""

    backend: str  # 'triton' or 'torch'
    config: TileConfig | None
    q_s: float
    fp16_s: float | None

    def to_json(self) -> dict[str, Any]:
        """Plain dict for the cache file."""
        return {
            "backend": self.backend,
            "config": dataclasses.asdict(self.config) if self.config else None,
            "q_s": self.q_s,
            "fp16_s": self.fp16_s,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Choice:
        """Inverse of `to_json`; raises on a malformed entry."""
        cfg = TileConfig(**d["config"]) if d.get("config") else None
        fp16 = d.get("fp16_s")
        return cls(str(d["backend"]), cfg, float(d["q_s"]), None if fp16 is None else float(fp16))


def _source_digest() -> str:
    """Hash of the kernel sources and the candidate rules: editing either invalidates the cache."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("kernels.py", "tiles.py", "layers.py"):
        with contextlib.suppress(OSError):
            h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def device_key(device: str) -> dict[str, str]:
    """The parts of the cache key that are not the layer: GPU, compute capability, library versions."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if str(device).startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        cc = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        name, cc = "cpu", "-"
    return {
        "format": str(FORMAT_VERSION),
        "device": name,
        "cc": cc,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": str(torch.version.cuda),
        "sources": _source_digest(),
        **_gemm_key(),
        **_small_batch_key(),
        **_conv_tma_key(),
    }


def _conv_tma_key() -> dict[str, str]:
    """With the TMA-fed 3×3 tiles offered (``on``), a key of its own with their source in it (as `_gemm_key`).

    Why: a layer tuned without them must never be a hit where they should be timed, nor the other way round
    (session 29's first run with ``DEEPGAP_QUANT_CONV_TMA=on`` took every 3×3 tile from the cache of the run
    before it, with the switch off, so no TMA tile was timed).
    """
    from deepgap.measure.quant import conv_tma

    return {"conv_tma": f"tma:{_digest('conv_tma.py')}"} if conv_tma.offered() else {}


def _small_batch_key() -> dict[str, str]:
    """With split-K offered (the default), a key of its own with split-K's source in it (as `_gemm_key`).

    With ``DEEPGAP_QUANT_SMALL_BATCH=off`` the key is the one the engine had before split-K tiles existed:
    a layer tuned without them is never a hit where they should be timed, nor the other way round. The
    switch's value is in the key too: 'split' offers fewer tiles than 'on' (`tiles.small_batch_mode`).
    """
    return (
        {"small_batch": f"split-k:{small_batch_mode()}:{_digest('split_k.py')}"}
        if small_batch_offered()
        else {}
    )


def _gemm_key() -> dict[str, str]:
    """With the persistent tiles (the default, or ``narrow``), a key of its own: the mode and the kernel's source.

    ``DEEPGAP_QUANT_GEMM=off`` keeps the key the engine had before they were offered, so a layer tuned
    without them is never a hit where they should be timed, nor the other way round.
    """
    mode = gemm_mode()
    return {"gemm": f"{mode}:{_digest('persistent.py')}"} if mode != "off" else {}


def _digest(name: str) -> str:
    """The first 16 hex digits of a kernel module's source hash (this package's file ``name``), '-' unread."""
    try:
        return hashlib.sha256((Path(__file__).parent / name).read_bytes()).hexdigest()[:16]
    except OSError:
        return "-"


class TuneCache:
    """The tile choices for one device and set of library versions, loaded once, saved on `put`."""

    def __init__(self, parts: dict[str, str], folder: Path | None = None) -> None:
        self.parts = dict(parts)
        digest = hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()[:16]
        self.path = (folder or cache_dir() / "quant") / f"tune-{digest}.json"
        self.hits = 0
        self.misses = 0
        self._entries: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        layers = doc.get("layers") if isinstance(doc, dict) else None
        if not isinstance(layers, dict) or doc.get("key") != self.parts:
            return {}  # another key under a colliding name, or damaged: start over
        return layers

    def get(self, shape: LayerShape) -> Choice | None:
        """The cached choice for ``shape``, or None (a malformed entry counts as absent)."""
        entry = self._entries.get(shape.key())
        if entry is None:
            return None
        try:
            return Choice.from_json(entry)
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, shape: LayerShape, choice: Choice) -> None:
        """Record ``choice`` and rewrite the file atomically; an unwritable cache is only a slower start."""
        self._entries[shape.key()] = choice.to_json()
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tune-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"key": self.parts, "layers": self._entries}, f, indent=0, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def summary(self) -> dict[str, Any]:
        """What to record in the engine's info: hits, misses and the file's name (no home folder)."""
        return {"hits": self.hits, "misses": self.misses, "file": self.path.name}
