r"""Paths given on the command line, checked before anything opens, creates or replaces them.

Why each check:

- **Not UTF-8.** A name with undecodable bytes (``bad\xff.sqlite``) reaches Python as a string with
  surrogates, which SQLite's URI, the stored command line and every message fail to encode: a
  traceback, after the file may already exist.
- **Too long.** SQLite fails on a name past the system's limit only after the store's folders were
  created, leaving empty folders behind.
- **Not a regular file.** Reading a FIFO blocks until a writer appears (a hang); a device node is
  read as an empty file and then written through, gets a ``-journal`` beside it, or is *replaced*
  by the rename that writes an export atomically (``-o /dev/null`` as root would replace the
  system's). Outputs take ``-`` for stdout instead.
- **SQLite's name for another file's log.** ``X-wal``, ``X-journal`` and ``X-shm`` are the names SQLite
  gives to database X's write-ahead log, rollback journal and shared memory. A store written as
  ``s.sqlite-journal`` was deleted the next time ``s.sqlite`` was opened (SQLite took it for a stale
  journal), and an export written as ``s.sqlite-wal`` would be read as s.sqlite's log.

A store path to write is checked whole (`check_path`): these checks, not a directory, a deepgap store if
it exists (`deepgap.store.header`), writable, and no merge or recovery holding it.
"""

from __future__ import annotations

import os
import stat

from deepgap.core.errors import StoreError, UsageError
from deepgap.store import writelock
from deepgap.store.header import check_header

STDOUT = "-"  # ``-o -``: write to standard output
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def shown(path: str) -> str:
    """``path`` as a message may print it (undecodable bytes as escapes, never an encoding error)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_encoding(path: str, what: str) -> None:
    """A `UsageError` unless ``path`` is valid UTF-8 text (no undecodable bytes)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{what} path '{shown(path)}' is not valid UTF-8",
            "rename the file or folder to a UTF-8 name, or pass another path",
        ) from None


def check_length(path: str, what: str) -> None:
    """A `UsageError` when ``path`` or one of its names is longer than the file system allows."""
    full = os.fsencode(os.path.abspath(path))
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        name_max = os.pathconf(folder or "/", "PC_NAME_MAX")
        path_max = os.pathconf(folder or "/", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max((len(part) for part in full.split(b"/")), default=0)
    if longest > name_max or len(full) >= path_max:
        raise UsageError(
            f"{what} path is too long ({len(full)} bytes, a name of {longest}; the limits here "
            f"are {path_max} and {name_max})",
            "pass a shorter path",
        )


_SYSTEM = ("/dev/", "/proc/", "/sys/")


def kind_of(path: str) -> str | None:
    """What ``path`` is when it exists and is not a regular file ("a FIFO (named pipe)", …); else None.

    A path that leads into /dev, /proc or /sys (``/dev/stdout`` → ``/proc/self/fd/1``) is a system
    path whatever it resolves to: replacing it, or its link, breaks the system.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None
    real = os.path.realpath(path)
    if real.startswith(_SYSTEM) or os.path.abspath(path).startswith(_SYSTEM):
        return "a system path (/dev, /proc or /sys)"
    if mode is None:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_input_path(path: str, what: str, fix: str = "pass a regular file") -> None:
    """A file the user names to be read (a dataset, its rows' images, a trace, weights, a sweep file).

    Why: the rule for stores and outputs covered only ``--store``, ``-o`` and ``--config``:
    ``--trace /proc/self/status`` or a dataset row naming a ``/proc`` file was opened and read, and a
    FIFO blocks a read forever. UTF-8, a length the system takes, and never a system path, FIFO,
    device or socket; a missing path is left to the caller, which says what it expected.
    """
    check_encoding(path, what)
    check_length(path, what)
    kind = kind_of(path)
    if kind and kind != "a directory":
        raise UsageError(f"{what} {shown(path)} is {kind}, not a file deepgap reads", fix)


def check_store_path(path: str) -> None:
    """A store path: UTF-8, of a length the system takes, and a regular file when it exists."""
    if path == STDOUT:
        raise UsageError("a store cannot be stdout (-)", "pass a file path, e.g. results.sqlite")
    check_encoding(path, "store")
    check_length(path, "store")
    kind = kind_of(path)
    if kind and kind != "a directory":  # the store's own check words a directory
        raise UsageError(
            f"store path {shown(path)} is {kind}, not a store file",
            "pass the path of a .sqlite file (a new one is created)",
        )


def check_not_companion(path: str, what: str, always: bool) -> None:
    """A `UsageError` when ``path`` is named as SQLite names another database's log, journal or shm file.

    ``always``: refuse whatever exists (a store: SQLite may open its base later); else only where the base
    is a SQLite database now (an export beside an unrelated ``notes-wal`` name is harmless).
    """
    for suffix, role in (
        ("-wal", "write-ahead log"),
        ("-journal", "rollback journal"),
        ("-shm", "shared memory"),
    ):
        base = path[: -len(suffix)]
        if not path.endswith(suffix) or not os.path.basename(base):
            continue
        if always or _is_sqlite(base):
            raise UsageError(
                f"{what} path {shown(path)} is the name SQLite gives to {shown(base)}'s {role}: opening "
                f"{shown(base)} would delete or overwrite it",
                f"pass another name, e.g. {shown(base)}{suffix.replace('-', '_')}.sqlite"
                if what == "store"
                else "pass another name",
            )


def _is_sqlite(path: str) -> bool:
    """Whether ``path`` is a regular file that begins with SQLite's header (a FIFO is never opened: it blocks)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def check_output_path(path: str, what: str = "output", stdout_ok: bool = True) -> None:
    """An output path that is written by replacing it: never a device, FIFO or socket (``-`` is stdout)."""
    if path == STDOUT:
        if stdout_ok:
            return
        raise UsageError(
            f"the {what} cannot go to stdout (-o -): it writes several files",
            "pass a file name, e.g. -o report.html",
        )
    check_encoding(path, what)
    check_length(path, what)
    check_not_companion(path, what, always=False)
    kind = kind_of(path)
    if kind and kind != "a directory":
        fix = "pass -o - to write to stdout, or a file name" if stdout_ok else "pass a file name"
        raise UsageError(f"cannot write {shown(path)}: it is {kind}, which would be replaced", fix)


def identity(path: str) -> tuple[int, int] | None:
    """The file ``path`` names, as (device, inode) after following links; None when there is none."""
    if not path or path == STDOUT:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


# a store's companions: writing over its log or journal destroys its newest rows just as surely
_COMPANIONS = ("", "-wal", "-journal", "-shm")


def same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file: by identity where both exist, by resolved name where neither does.

    Why the name: two outputs that do not exist yet have no identity, and ``run --store new.sqlite --report
    new.sqlite`` measured into a new store and then replaced it by the report.
    """
    ia, ib = identity(a), identity(b)
    if ia is not None or ib is not None:
        return ia == ib
    return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(named: dict[str, tuple[str, ...] | list[str] | str | None], writes: set[str]) -> None:
    """A `UsageError` when an output is the same file as any other path the command names.

    Why: ``export s.sqlite -o s.sqlite`` replaced the store by its CSV, and ``run --store s --report s``
    by a report after measuring. Names are compared by file identity (device and inode, links
    followed), so a symbolic or hard link to an input counts too, and so does a path's ``-wal`` or
    ``-journal`` (a store's newest rows); names that do not exist yet are compared as resolved paths
    (`same_file`). ``named``: each flag as the user wrote it → its path(s); ``writes``: the flags among
    them that are written. Checked before anything is read or written.
    """
    flat = [
        (flag, p)
        for flag, value in named.items()
        for p in ([value] if isinstance(value, str) else list(value or ()))
        if p and p != STDOUT
    ]
    for out_flag, out in flat:
        if out_flag not in writes:
            continue
        for flag, other in flat:
            if flag == out_flag and other == out:
                continue
            for suffix in _COMPANIONS:
                if same_file(out, other + suffix):
                    what = f"the {suffix[1:]} file of " if suffix else ""
                    what += f"{flag} {shown(other)}"
                    harm = (
                        "one would replace the other"
                        if flag in writes
                        else "writing the output would destroy the input itself"
                    )
                    raise UsageError(
                        f"{out_flag} {shown(out)} and {what} are one file: {harm}", "pass another output path"
                    )


def check_not_a_store(named: dict[str, str | None], what: str = "output") -> None:
    """A `UsageError` when a non-store output (``-o``, ``--report``, ``--screenshot``) names an existing SQLite store.

    Why: ``export a.sqlite -o b.sqlite``, ``report … -o b.sqlite`` and ``run … --report b.sqlite`` replaced
    another store, whole, by CSV or HTML text and exited 0; only an output that was the input itself was
    refused. A store is never an output's target unless the command writes stores (``--store``, ``merge -o``).
    """
    for flag, path in named.items():
        if isinstance(path, str) and path != STDOUT and _is_sqlite(path):
            raise UsageError(
                f"{flag} {shown(path)} is an SQLite store: writing the {what} there would replace its measurements",
                f"pass another {flag} path",
            )


OWNED = ".deepgap-owned"  # the marker deepgap writes into each folder it makes (a report's _files/)


def claim_folder(folder: str) -> None:
    """Mark ``folder`` as deepgap's, so that a later report may replace it (`check_owned_folder`)."""
    with open(os.path.join(folder, OWNED), "w", encoding="utf-8") as fh:
        fh.write("made by deepgap; it replaces this folder when it writes the report again\n")


def check_owned_folder(folder: str) -> None:
    """A `UsageError` when ``folder`` exists but deepgap did not make it (no `OWNED` marker).

    Why: ``report -o my.html`` replaced an existing ``my_files/`` folder, deleting everything in it,
    although deepgap never wrote it. A folder deepgap made carries the marker.
    """
    if not os.path.lexists(folder):
        return
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise UsageError(f"{shown(folder)} exists and is not a folder", "remove it or pass another -o path")
    if not os.path.isfile(os.path.join(folder, OWNED)):
        raise UsageError(
            f"{shown(folder)} exists and deepgap did not make it (its files would be replaced)",
            "move it away or pass another -o path",
        )
    # a report writes PNGs, CSVs and its marker: anything else was put there (a store: it was deleted)
    foreign = sorted(n for n in os.listdir(folder) if n != OWNED and not n.endswith((".png", ".csv")))
    if foreign:
        raise UsageError(
            f"{shown(folder)} holds files a report does not write ({shown(', '.join(foreign[:3]))}): "
            "replacing the folder would delete them",
            "move them away or pass another -o path",
        )


def writable_file(path: str, flag: str, example: str, prefix: str = ".deepgap-probe-") -> str:
    """The nearest existing folder of a new file ``path``, once a file was made and removed there.

    Else a one-line `UsageError`. The probe tells of read-only mounts and full disks, as permission bits do not.
    """
    import tempfile

    fix, probe = f"pass a writable {flag} path", nearest_existing(os.path.dirname(os.path.abspath(path)))
    says = f"cannot write {path}:"
    if os.path.isdir(path):
        raise UsageError(f"{says} it is a directory", f"pass a file name, e.g. {flag} {example}")
    if not os.path.isdir(probe):
        raise UsageError(f"{says} {probe} is a file, not a folder", fix)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{says} {probe} is not a writable folder", fix)
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=prefix)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"{says} {exc.strerror} in {probe}", fix) from None
    return probe


def make_folders(folder: str) -> list[str]:
    """Make ``folder`` and any missing folder above it; returns those made, deepest first (for `remove_folders`)."""
    made = []
    found = os.path.abspath(folder)
    while not os.path.exists(found):
        made.append(found)
        found = os.path.dirname(found)
    os.makedirs(folder, exist_ok=True)
    return made


def remove_folders(made: list[str]) -> None:
    """Remove the folders `make_folders` made, deepest first, where still empty (a failed write leaves none)."""
    for folder in made:
        try:
            os.rmdir(folder)
        except OSError:
            break


def nearest_existing(path: str) -> str:
    """``path`` made absolute, or the nearest folder above it that exists: where a new file or folder goes."""
    found = os.path.abspath(path)
    while not os.path.exists(found):
        found = os.path.dirname(found)
    return found


def check_writable(path: str, exists: bool) -> None:
    """Raise a `StoreError` unless ``path`` (or the nearest existing folder above it) is writable."""
    if exists:
        if not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            raise StoreError(
                f"store path {path} is not writable", "pass a store path in a folder you can write to"
            )
        return
    folder = nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(
            f"store path {path} is not writable (no write access to {folder})",
            "pass a store path in a folder you can write to",
        )


def check_folder(path: str, what: str) -> None:
    """Raise a `UsageError` unless ``path`` is a folder that can be written to, or can be created as one.

    Why before measuring: a file named where a folder goes (``--trace-dir afile/x``) failed only when the
    first profile tried to write there, after its measurement.
    """
    fix = f"pass a writable folder, e.g. {what} traces"
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{what} {shown(path)} is a file, not a folder", fix)
    folder = nearest_existing(path)
    if not os.path.isdir(folder):
        raise UsageError(f"{what} {shown(path)} cannot be created: {shown(folder)} is a file", fix)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {shown(path)} is not writable (no write access to {shown(folder)})", fix)


def check_path(path: str) -> None:
    """Validate a store path for writing without creating anything (bad input must write nothing)."""
    if not str(path).strip():
        raise StoreError("the store path is empty", "pass --store PATH, e.g. --store results.sqlite")
    check_store_path(path)
    check_not_companion(path, "store", always=True)
    if os.path.isdir(path):
        raise StoreError(f"store path {path} is a directory", "pass a file path, e.g. results.sqlite")
    exists = os.path.exists(path)
    if not exists:  # a log or journal left without its store: a new store there reads it in, or deletes it
        orphan = next((path + s for s in ("-wal", "-journal") if os.path.lexists(path + s)), None)
        if orphan:
            raise StoreError(
                f"{shown(orphan)} exists without its store {shown(path)}: a new store there would take in "
                "its rows or delete it",
                "move it away (with its store, if you have one) or pass another path",
            )
    if exists:
        check_header(path)  # not a store, a newer one, a damaged header
    check_writable(path, exists)
    if exists:  # a merge or recovery of it: wait (bounded) or refuse now, before a worker is started
        writelock.acquire(path, False, "write to").release()
