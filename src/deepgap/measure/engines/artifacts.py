"""The on-disk cache of engine artifacts: ONNX exports, quantized models, calibration tables, TensorRT engines.

Why a cache: exporting, quantizing and building take seconds to minutes and give the same bytes for
the same inputs, so a sweep over batch sizes (or a resumed run) builds once. Why keyed by a hash of
*everything* that changes the bytes (model, resolution, weights fingerprint, precision, device,
library version, and the engine's own settings): a stale artifact silently measured in place of
the right one would be a wrong number, so a key never omits an input. Writes are atomic (a
temporary file in the same folder, then ``os.replace``), so a crash mid-write leaves no half file.

The folder is ``$DEEPGAP_CACHE`` when set, else ``~/.cache/deepgap``; the sweep option
``cache_dir`` overrides both. Every artifact has a ``.json`` sidecar naming its key's parts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE_ENV = "DEEPGAP_CACHE"


def cache_dir(options: dict[str, Any] | None = None) -> Path:
    """The cache folder (created): option ``cache_dir``, else ``$DEEPGAP_CACHE``, else ``~/.cache/deepgap``."""
    root = (
        (options or {}).get("cache_dir")
        or os.environ.get(CACHE_ENV)
        or os.path.join("~", ".cache", "deepgap")
    )
    path = Path(os.path.expanduser(str(root)))
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifact_key(parts: dict[str, Any]) -> str:
    """A short stable hash (20 hex) of ``parts`` (JSON with sorted keys; values must be JSON-able)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


def artifact_path(
    kind: str, label: str, parts: dict[str, Any], suffix: str, options: dict[str, Any] | None = None
) -> Path:
    """Where the artifact of ``kind`` with key ``parts`` lives: ``<cache>/<kind>/<label>-<hash><suffix>``."""
    folder = cache_dir(options) / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{_slug(label)}-{artifact_key(parts)}{suffix}"


@contextlib.contextmanager
def atomic_path(path: Path, parts: dict[str, Any] | None = None) -> Iterator[Path]:
    """Yield a temporary path to write; on success move it to ``path`` (and write the key sidecar)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if parts is not None:
            side = path.with_name(path.name + ".json")
            side.write_text(json.dumps(parts, sort_keys=True, indent=1, default=str))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_bytes(path: Path, data: bytes, parts: dict[str, Any] | None = None) -> None:
    """Atomically write ``data`` to ``path``."""
    with atomic_path(path, parts) as tmp:
        tmp.write_bytes(data)


def file_sha(path: str | os.PathLike[str]) -> str:
    """SHA-256 (first 16 hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def library_version(package: str) -> str | None:
    """Installed version of ``package`` (distribution name), or None."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
