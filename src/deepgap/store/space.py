"""A full disk, told apart from a damaged store.

Why: on a full disk SQLite cannot size a store's log index (``-shm``) and reports "disk I/O error",
which read as damaged pages; the user was sent to recover a healthy store, and the failed command
left an empty ``-wal``/``-shm`` behind. Writers now check the free space before they open a store
(`check_space`), and `deepgap.store.guard.translate` names a full disk as such.
"""

from __future__ import annotations

import os

from deepgap.core.errors import StoreFullError

MIN_FREE_BYTES = 1 << 20  # below this a writer refuses to start: SQLite needs room for its log and index


def free_bytes(path: str) -> int | None:
    """Bytes free to this user on the disk that holds (or will hold) ``path``; None if unknown."""
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # pragma: no cover - Windows
        return None
    return st.f_bavail * st.f_frsize


def disk_full(path: str) -> bool:
    """Whether the disk of ``path`` is (nearly) full: SQLite then reports a healthy file's I/O as errors."""
    free = free_bytes(path)
    return free is not None and free < MIN_FREE_BYTES


def full_error(path: str) -> StoreFullError:
    """The one line for a full disk: the store is not damaged, and keeps what it held.

    A store not yet written (``run`` on a new path) has nothing to keep or resume: its advice names
    no ``--resume``, which would then fail for want of a store (issue 46).
    """
    free = free_bytes(path) or 0
    try:
        new = os.path.getsize(path) == 0
    except OSError:
        new = True
    if new:
        return StoreFullError(
            f"the disk holding {path} is full ({free // 1024} KiB free); nothing was written",
            "free disk space (at least 1 MiB), then run the same command again",
        )
    return StoreFullError(
        f"the disk holding {path} is full ({free // 1024} KiB free); the store is not damaged "
        "and keeps everything stored before",
        "free disk space (at least 1 MiB), then run this again "
        "(`deepgap run --resume` continues an interrupted run)",
    )


def check_space(path: str) -> None:
    """A `StoreFullError` before writing to ``path`` on a full disk (so that no ``-wal``/``-shm`` is made)."""
    if disk_full(path):
        raise full_error(path)
