"""The SQLite stores under ``tests/fixtures/`` are kept xz-compressed, as ``NAME.sqlite.xz``: the one place
that packs and unpacks them.

Why xz: the tracked tree has a 10 MB budget (``tests/whole/test_tree_size.py``) and the stores are its largest
files. Python's ``lzma`` (stdlib) at preset 9e keeps the 25 stores in 1.15 MB where ``gzip -9`` took
1.98 MB (the serve store's repeated request rows: 559 KB as gzip, 178 KB as xz), and the unpacked bytes
are the same, byte for byte: the archived stores stay the files the project once committed. Seven of the
nine under ``archive/`` were VACUUMed before packing in session 47: every table's rows and rowids are the
committed store's, its pages laid out afresh (47 KB less as xz). Unpacking all of them takes well under a
second.
"""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

SUFFIX = ".xz"
PRESET = 9 | lzma.PRESET_EXTREME  # the smallest file; packing a fixture is rare, reading it cheap


def packed(store: str | Path) -> Path:
    """The committed file that holds ``store`` (a path ending in ``.sqlite``)."""
    return Path(f"{store}{SUFFIX}")


def unpack(src: Path, dst: Path) -> Path:
    """Write the store packed in ``src`` to ``dst`` (a writable copy); ``src`` is only read."""
    with lzma.open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


def pack(data: bytes) -> bytes:
    """A store's bytes as they are committed (the same bytes for the same input: no timestamp in xz)."""
    return lzma.compress(data, preset=PRESET)
