"""A labelled image set: an ImageFolder tree or a CSV of ``path,label``; its identity and its seeded split.

Why a split: INT8/FP8 calibrated on the images it is scored on would overstate its accuracy. A seeded
permutation puts the first ``calibration`` images into the calibration split and the rest into the
evaluation split, for every configuration of the run (fp32 included), so all are scored on the same
images. The identity (``sha``) is a hash of the relative paths and labels: it goes into the run's spec
and into every calibration cache key, and a resumed run refuses a dataset that changed.

Class indices: an ImageFolder's classes are its sub-folders in sorted order (torchvision's rule, which
gives ImageNet's wnid folders the indices torchvision's checkpoints use); a CSV's labels are integers
used as they are, or names, then indexed in sorted order (never a mix of the two).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.limits import is_number
from deepgap.measure.images import DEFAULT_CALIBRATION_IMAGES, IMAGE_SUFFIXES, options_count
from deepgap.store.paths import check_input_path

SPLIT_SEED_OFFSET = 104_729  # keeps the split's permutation apart from every other seeded draw
DEFAULT_CALIBRATION = DEFAULT_CALIBRATION_IMAGES


@dataclass(frozen=True)
class LabelledSet:
    """Items ``(absolute path, label)`` in a fixed order, the class names, and the set's identity."""

    path: str
    kind: str  # "folder" | "csv"
    items: tuple[tuple[str, int], ...]
    classes: tuple[str, ...]
    sha: str


MAX_CLASSES = 1_000_000  # a class index past this is a typo, not a data set (ImageNet-21k has 21,841)
_DATASET_FIX = "pass an ImageFolder (one sub-folder of images per class) or a CSV of path,label"


def load(path: str) -> LabelledSet:
    """Read an ImageFolder tree or a CSV; a `UsageError` for a missing path, an empty class or a bad row."""
    p = Path(os.path.expanduser(str(path)))
    check_input_path(str(p), "dataset", _DATASET_FIX)
    if os.path.isdir(p):  # os.path: a name too long for the system is "not there", not an OSError
        return _folder(p)
    if os.path.isfile(p):
        return _csv(p)
    raise UsageError(
        f"dataset {path!r} does not exist",
        "pass an ImageFolder (one sub-folder of images per class) or a CSV of path,label",
    )


def _identity(kind: str, root: Path, items: list[tuple[str, int]]) -> str:
    h = hashlib.sha256(kind.encode())
    for f, label in items:
        h.update(f"\n{os.path.relpath(f, root)}\t{label}".encode())
    return h.hexdigest()[:16]


def _folder(root: Path) -> LabelledSet:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UsageError(
            f"dataset folder {str(root)!r} has no class sub-folders",
            "arrange it as ROOT/<class>/<image>, e.g. ImageNet's val/n01440764/*.JPEG",
        )
    items: list[tuple[str, int]] = []
    for i, c in enumerate(classes):
        files = sorted(f for f in (root / c).rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise UsageError(
                f"dataset class folder {str(root / c)!r} holds no images ({', '.join(IMAGE_SUFFIXES)})",
                "add images to it or remove the empty folder",
            )
        items += [(str(f.resolve()), i) for f in files]
    return LabelledSet(
        str(root.resolve()),
        "folder",
        tuple(items),
        tuple(classes),
        _identity("folder", root.resolve(), items),
    )


def _csv(path: Path) -> LabelledSet:
    base = path.resolve().parent
    try:
        with open(path, newline="") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"dataset CSV {str(path)!r} cannot be read ({exc})", "pass a text CSV of path,label"
        ) from None
    if rows and [c.strip().lower() for c in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]
    if not rows:
        raise UsageError(f"dataset CSV {str(path)!r} has no rows", "write one path,label line per image")
    pairs = []
    for n, r in enumerate(rows, 1):
        if len(r) < 2 or not r[0].strip() or not r[1].strip():
            raise UsageError(
                f"dataset CSV {str(path)!r} row {n} is not path,label: {r!r}", "write e.g. img/1.png,3"
            )
        f = Path(os.path.expanduser(r[0].strip()))
        f = f if f.is_absolute() else base / f
        check_input_path(str(f), f"dataset CSV {str(path)!r} row {n}: image", "name image files only")
        if not f.is_file():
            raise UsageError(
                f"dataset CSV {str(path)!r} row {n}: image {str(f)!r} does not exist",
                "fix the path (relative paths are relative to the CSV's folder)",
            )
        pairs.append((str(f.resolve()), r[1].strip()))
    labels = [lab for _, lab in pairs]
    _check_labels(path, labels)
    if all(_is_int(lab) for lab in labels):
        ints = [int(lab) for lab in labels]
        if min(ints) < 0:
            raise UsageError(
                f"dataset CSV {str(path)!r} has a negative label", "labels are class indices ≥ 0"
            )
        if max(ints) >= MAX_CLASSES:  # the classes are 0 … max: a label of 10^12 made 10^12 names
            raise UsageError(
                f"dataset CSV {str(path)!r} has the class index {max(ints)}, beyond {MAX_CLASSES - 1:,}",
                "labels are class indices 0, 1, … (or class names)",
            )
        classes = tuple(str(i) for i in range(max(ints) + 1))
        items = list(zip([f for f, _ in pairs], ints, strict=True))
    else:
        classes = tuple(sorted(set(labels)))
        index = {c: i for i, c in enumerate(classes)}
        items = [(f, index[lab]) for f, lab in pairs]
    return LabelledSet(str(path.resolve()), "csv", tuple(items), classes, _identity("csv", base, items))


def _is_int(label: str) -> bool:
    """ASCII digits only: ``²`` is a digit to `str.isdigit` but no integer to `int` (a ValueError)."""
    return re.fullmatch(r"-?[0-9]+", label) is not None


def _check_labels(path: Path, labels: list[str]) -> None:
    """All labels integers (class indices) or all names: a mix, or numbers that are not integers, is an error.

    Why: with one name among them (``3,cat``) every label used to become a name, sorted as text, so
    the image labelled 3 was scored against class 0 without a word; ``0.5`` is no class index at all.
    """
    ints = [lab for lab in labels if _is_int(lab)]
    numbers = [lab for lab in labels if not _is_int(lab) and is_number(lab)]
    if numbers:
        raise UsageError(
            f"dataset CSV {str(path)!r} has the label {numbers[0]!r}: not a class index",
            "use integer class indices (0, 1, …) or class names",
        )
    if ints and len(ints) < len(labels):
        name = next(lab for lab in labels if not _is_int(lab))
        raise UsageError(
            f"dataset CSV {str(path)!r} mixes class indices ({ints[0]!r}) and names ({name!r})",
            "use integer class indices for every row, or names for every row",
        )


def split_sizes(n: int, calibration: int, samples: int | None) -> tuple[int, int]:
    """(calibration, evaluation) sizes: at most half the set calibrates; ``samples`` caps evaluation."""
    n_cal = min(calibration, n // 2)
    n_eval = n - n_cal if samples is None else min(samples, n - n_cal)
    return n_cal, n_eval


def split(
    ds: LabelledSet, calibration: int, samples: int | None, seed: int = 0
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Disjoint (calibration, evaluation) items from one seeded permutation, each in the set's order."""
    n_cal, n_eval = split_sizes(len(ds.items), calibration, samples)
    order = list(range(len(ds.items)))
    random.Random(seed + SPLIT_SEED_OFFSET).shuffle(order)
    cal = sorted(order[:n_cal])
    ev = sorted(order[n_cal : n_cal + n_eval])
    return [ds.items[i] for i in cal], [ds.items[i] for i in ev]


def check_images(items: list[tuple[str, int]]) -> None:
    """PIL's structural check of every image used (header, PNG chunk CRCs), without decoding pixels."""
    from PIL import Image

    for f, _ in items:
        try:
            with Image.open(f) as im:
                im.verify()
        except Exception as exc:
            raise UsageError(
                f"dataset image {f!r} is corrupt or not an image ({type(exc).__name__}: {exc})",
                "remove or replace it",
            ) from None


def check_weights(model: str, resolution: int | None, weights: str) -> None:
    """The models registry's check (one place for it), at the model's default resolution if none given."""
    from deepgap.measure.models import resolve_model
    from deepgap.measure.models.build import check_weights as _check

    _check(model, resolution or resolve_model(model).default_resolution, weights)


def describe(spec: Any) -> dict[str, Any] | None:
    """The dataset facts a sweep stores in ``options['dataset']``; checks everything (exit 2 on bad input)."""
    from deepgap.measure.models import resolve_model

    if not spec.dataset:
        return None
    if spec.accuracy_samples is not None and (
        isinstance(spec.accuracy_samples, bool)
        or not isinstance(spec.accuracy_samples, int)
        or spec.accuracy_samples < 1
    ):
        raise UsageError(
            f"accuracy_samples must be a positive integer, got {spec.accuracy_samples!r}",
            "pass e.g. --accuracy-samples 1000",
        )
    ds = load(spec.dataset)
    for m in spec.models:
        k = resolve_model(m).num_classes
        top = max(label for _, label in ds.items)
        if top >= k:
            raise UsageError(
                f"dataset {spec.dataset!r} has label {top} but {m} has {k} classes",
                "use a dataset whose labels are the model's class indices",
            )
    n_cal = (spec.options or {}).get("calibration_images", DEFAULT_CALIBRATION)
    options_count({"calibration_images": n_cal})
    cal, ev = split(ds, n_cal, spec.accuracy_samples, spec.seed)
    if not ev:
        raise UsageError(
            f"dataset {spec.dataset!r} has {len(ds.items)} image(s): none left to evaluate",
            "use at least 2 labelled images",
        )
    check_images(cal + ev)
    return {
        "path": ds.path,
        "kind": ds.kind,
        "sha": ds.sha,
        "images": len(ds.items),
        "classes": len(ds.classes),
        "calibration_images": len(cal),
        "eval_images": len(ev),
        "samples": spec.accuracy_samples,
        "split_seed": spec.seed + SPLIT_SEED_OFFSET,
        "subset": (
            f"{len(ev)} of the {len(ds.items) - len(cal)} evaluation images"
            if spec.accuracy_samples and len(ev) < len(ds.items) - len(cal)
            else "whole evaluation split"
        ),
    }


def reload(info: dict[str, Any]) -> tuple[LabelledSet, list[tuple[str, int]], list[tuple[str, int]]]:
    """The set and its (calibration, evaluation) split from ``options['dataset']``; refuses a changed set."""
    ds = load(info["path"])
    if ds.sha != info["sha"]:
        raise UsageError(
            f"dataset {info['path']!r} changed since the run started (hash {ds.sha} ≠ {info['sha']})",
            "restore it, or start a new run instead of resuming",
        )
    cal, ev = split(
        ds, info["calibration_images"], info.get("samples"), info["split_seed"] - SPLIT_SEED_OFFSET
    )
    return ds, cal, ev


def serve_options(spec: Any) -> dict[str, Any]:
    """``deepgap serve``'s accuracy options (``{"dataset": …}`` or {}); checks weights and dataset (exit 2).

    Cached: validation, the stored spec and the worker's request all ask, and the images are verified once.
    """
    return _serve_options(
        spec.model, spec.resolution, spec.weights, spec.dataset, spec.accuracy_samples, spec.seed
    )


@functools.lru_cache(maxsize=8)
def _serve_options(
    model: str,
    resolution: int | None,
    weights: str | None,
    dataset: str | None,
    samples: int | None,
    seed: int,
) -> dict[str, Any]:
    from types import SimpleNamespace

    if weights:
        check_weights(model, resolution, weights)
    if not dataset:
        return {}
    shim = SimpleNamespace(dataset=dataset, accuracy_samples=samples, models=(model,), options={}, seed=seed)
    return {"dataset": describe(shim)}
