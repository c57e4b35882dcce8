"""The store's write lock: appenders together, or one command that rewrites the file, never both.

Why: SQLite serialises transactions, so two runs appending to one store is safe (each result is one
transaction). What SQLite cannot protect is a command that *replaces* the file (``merge … -o S``
builds a new file and renames it over S; ``--redact`` in place is such a merge) or copies its bytes
(``check --recover`` reads the file and its log as they are): a run writing S meanwhile kept writing
into the replaced file's log, so the merged run was lost and S got a corrupt index. So:

- every writing `Store` (run, serve, profile, peaks, a fleet) takes the lock *shared*;
- ``merge`` takes it *exclusive* on its output, and ``--recover`` on the store it copies.

Either waits up to `WAIT_S` seconds for the other kind to finish, then refuses with one line that
names the holders (pid and command). The lock is ``flock`` on a file ``S-lock`` beside the store:
a lock file of its own, because closing *any* descriptor of the store file itself would drop
SQLite's POSIX locks (`deepgap.store.held`); ``flock`` is released by the kernel when its holder
dies (``kill -9`` leaves a stale, harmless file). Each holder appends a line (pid, mode, time,
command) to the file; the last one out removes it, and the first one in drops the lines of holders
that were killed (stale). Linux and macOS; where ``fcntl`` is missing (Windows) the lock is a no-op.

The lock cannot be aimed (issue 46): the lock file is opened with ``O_NOFOLLOW`` and must be a regular
file with one name, so a ``S-lock`` planted as a link to another file is refused, never truncated or
appended to. And a store with more than one name (a hard link) is refused for writing: SQLite keeps
the log beside the *name*, so two runs through two names of one file each wrote their own log, and
results vanished at the next checkpoint; one store file, one name, one lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shlex
import stat
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from deepgap.core.errors import StoreError, StoreFullError, UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

WAIT_S: float | None = None  # how long a command waits for the lock (None: DEEPGAP_LOCK_WAIT_S, else 15 s)
MAX_WAIT_S = 86400.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Holder:
    """One process that holds (or held) the lock: what `refusal` and ``check`` name."""

    pid: int
    mode: str  # "shared" (appending) or "exclusive" (rewriting)
    since: float
    command: str

    def describe(self) -> str:  # noqa: D102
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        me = ", this process" if self.pid == os.getpid() else ""
        return f"pid {self.pid}{me} ({self.command}, since {when})"


_EXCLUSIVE: Counter[str] = Counter()  # lock files this process holds exclusive: it may open what it rewrites


@dataclass
class Lock:
    """A held lock; `release` it (or use `exclusive` as a context manager)."""

    path: str  # the lock file
    fd: int | None
    exclusive: bool = False

    def release(self) -> None:
        """Drop the lock; the last holder removes the lock file."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        if self.exclusive:
            _EXCLUSIVE[self.path] -= 1
            if not _EXCLUSIVE[self.path]:
                del _EXCLUSIVE[self.path]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else holds it: remove the file
            if _same_file(fd, self.path):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        except OSError:
            pass  # others still hold it
        finally:
            os.close(fd)


def lock_path(store: str) -> str:
    """The lock file of ``store`` (beside the real file when ``store`` is a symbolic link)."""
    return os.path.realpath(store) + "-lock"


def this_command() -> str:
    """This process's command line, as a user typed it (``deepgap …`` for the CLI)."""
    argv = list(sys.argv) or ["python"]
    if argv[0].endswith(("deepgap", "__main__.py")):
        argv[0] = "deepgap"
    return shlex.join(argv)[:200]


def acquire(
    store: str, exclusive: bool, what: str, wait_s: float | None = None, optional: bool = False
) -> Lock:
    """Take the lock of ``store`` (waiting up to ``wait_s``, default `WAIT_S`), or a `StoreError`.

    ``what``: the action, for the refusal ("merge into", "write to" …). ``optional``: where no lock
    file can be made (a read-only folder or disk, which nobody writes either), go on without one.
    """
    path = lock_path(store)
    if fcntl is None:  # pragma: no cover
        return Lock(path, None)
    if os.path.exists(store) and not os.path.isfile(store):  # no lock file beside a device node or FIFO
        raise StoreError(f"{store} is not a regular file", "pass a store file path, e.g. results.sqlite")
    check_one_name(store)
    if path in _EXCLUSIVE:  # this process rewrites the store: what it opens on it meanwhile is its own
        return Lock(path, None)
    deadline = time.monotonic() + (default_wait_s() if wait_s is None else wait_s)
    while True:
        try:
            fd = _open(path)
        except OSError as exc:
            unwritable = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
            if exc.errno == errno.ENOENT or (optional and unwritable):
                return Lock(path, None)  # no folder yet: no store there for anyone to write
            raise _cannot(store, path, exc) from None
        try:
            _take(fd, exclusive)
        except OSError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise refusal(store, what) from None
            time.sleep(_POLL_S)
            continue
        if not _same_file(fd, path):  # removed (and maybe re-created) by its last holder meanwhile
            os.close(fd)
            continue
        _note(fd, exclusive)
        if exclusive:
            _EXCLUSIVE[path] += 1
        return Lock(path, fd, exclusive)


@contextlib.contextmanager
def exclusive(store: str, what: str, wait_s: float | None = None, optional: bool = False) -> Iterator[Lock]:
    """The lock of ``store``, exclusive, for a ``with`` block (a command that rewrites or copies it)."""
    lock = acquire(store, True, what, wait_s, optional)
    try:
        yield lock
    finally:
        lock.release()


def default_wait_s() -> float:
    """`WAIT_S`, or ``DEEPGAP_LOCK_WAIT_S``: a `UsageError` (exit 2) unless 0 to `MAX_WAIT_S` seconds.

    Why: read at import, ``abc`` was a ValueError traceback before any command ran, and ``nan`` or
    ``inf`` made a refused lock wait forever.
    """
    if WAIT_S is not None:
        return WAIT_S
    text = os.environ.get("DEEPGAP_LOCK_WAIT_S", "15")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_WAIT_S:  # nan fails both
        raise UsageError(
            f"DEEPGAP_LOCK_WAIT_S={text[:40]!r} is not a number of seconds from 0 to {MAX_WAIT_S:g}",
            "set it to e.g. 15, or unset it",
        )
    return value


_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK


def _open(path: str) -> int:
    """The lock file's descriptor: never through a link, never a FIFO, device or a second name of a file."""
    fd = os.open(path, _OPEN_FLAGS | getattr(os, "O_CLOEXEC", 0), 0o644)  # a symlink: ELOOP
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        return fd
    os.close(fd)
    raise OSError(errno.ELOOP, "not a regular file of its own (a hard link, device or FIFO)")


def _take(fd: int, exclusive: bool) -> None:
    """``flock`` without waiting; alone, first drop the lines that killed holders left (stale)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        return
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # nobody holds it: every line in it is a dead holder's
    if not exclusive:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)


def check_one_name(store: str) -> None:
    """A `StoreError` when ``store`` is a file with more than one name (a hard link): see the module doc."""
    try:
        links = os.stat(store).st_nlink
    except OSError:
        return
    if links > 1:
        raise StoreError(
            f"{store} is one file with {links} names (hard links): SQLite keeps its log beside each name, "
            "so writing it through two of them loses results",
            f"write a copy instead (cp {shlex.quote(store)} copy.sqlite), or remove the other names",
        )


def holders(store: str) -> list[Holder]:
    """The processes holding ``store``'s lock now (empty: nobody writes it). Takes nothing itself."""
    path = lock_path(store)
    if fcntl is None or not os.path.exists(path):  # pragma: no cover - fcntl
        return []
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # held: read who holds it
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return []
        with os.fdopen(os.dup(fd), "r", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    finally:
        os.close(fd)
    found: dict[int, Holder] = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            d = json.loads(line)
            h = Holder(int(d["pid"]), str(d["mode"]), float(d["since"]), str(d["command"]))
            if _alive(h.pid):
                found[h.pid] = h
    return list(found.values())


def refusal(store: str, what: str) -> StoreError:
    """The one line that says who holds ``store`` and what to do."""
    hs = holders(store)
    who = "; ".join(h.describe() for h in hs) if hs else "another process"
    writing = "being rewritten" if any(h.mode == "exclusive" for h in hs) else "being written"
    return StoreError(
        f"cannot {what} {store}: it is {writing} by {who}",
        "wait until that command finishes (or stop it), then run this again",
    )


def _note(fd: int, exclusive: bool) -> None:
    """Append this holder's line (the exclusive holder starts the file afresh)."""
    line = (
        json.dumps(
            {
                "pid": os.getpid(),
                "mode": "exclusive" if exclusive else "shared",
                "since": time.time(),
                "command": this_command(),
            }
        )
        + "\n"
    )
    with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, unnamed
        if exclusive:
            os.ftruncate(fd, 0)
        os.write(fd, line.encode("utf-8"))


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cannot(store: str, path: str, exc: OSError) -> StoreError:
    if exc.errno == errno.ELOOP:
        return StoreError(
            f"cannot lock {store}: its lock file {path} is a link, device or FIFO, not deepgap's lock",
            f"remove {path} (nothing of the store is in it), then run this again",
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(
            f"the disk holding {store} is full (cannot create its lock file {path})",
            "free disk space, then run this again",
        )
    return StoreError(
        f"cannot lock {store} for writing: {path}: {exc.strerror}",
        "pass a store in a folder you can write to",
    )


def remove_new_logs(store: str, created: list[str]) -> None:
    """Remove the ``-wal``/``-shm`` that a failed open of ``store`` made, if empty and no one writes it.

    Why: on a full disk SQLite creates the log and its index but cannot size them, and the failed
    command left them beside a healthy store. A log with content holds committed rows: it stays.
    """
    wal = f"{store}-wal"
    if not created or (os.path.exists(wal) and os.path.getsize(wal) > 0):
        return
    try:
        lock = acquire(store, True, "clean up", wait_s=0)
    except StoreError:
        return  # another writer has the store open: the files are its own
    try:
        for f in created:
            with contextlib.suppress(OSError):
                os.remove(f)
    finally:
        lock.release()
