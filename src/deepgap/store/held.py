"""The store files this process holds open, so that nothing reads them through a second descriptor.

Why: SQLite's locks on a file are POSIX advisory locks, and those belong to the process, not to the
descriptor: closing *any* descriptor of the file drops every lock the process holds on it, SQLite's
connections' included. A plain ``open``/``close`` of a store that a `Store` here has open (the header
check of a second `Store` on the same file) therefore left its connection unlocked, and the next
reader in another process, finding no one holding the file, checkpointed and deleted the write-ahead
log this process kept writing to: results became invisible and a kill would lose them. SQLite's own
connections avoid this (its VFS shares one descriptor per file within a process); `header.check_header`
asks here first and skips the raw read of a file already held, which was checked when first opened.
"""

from __future__ import annotations

import os
from collections import Counter

_HELD: Counter[tuple[int, int]] = Counter()  # (device, inode) -> open Stores on it in this process


def key(path: str) -> tuple[int, int] | None:
    """The file's identity (a renamed or replaced file is another file), or None if it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def hold(path: str) -> tuple[int, int] | None:
    """Count one more open `Store` on ``path``; returns the key to `release` with."""
    k = key(path)
    if k is not None:
        _HELD[k] += 1
    return k


def release(k: tuple[int, int] | None) -> None:
    """Count one open `Store` less on the file ``k`` names."""
    if k is not None and _HELD[k] > 0:
        _HELD[k] -= 1
        if not _HELD[k]:
            del _HELD[k]


def is_held(path: str) -> bool:
    """Whether a `Store` in this process has ``path`` open."""
    k = key(path)
    return k is not None and _HELD[k] > 0
