"""The ``deepgap`` command: thin wiring. Each sub-command is one module in `deepgap.commands`.

A command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``main(args) -> int``;
modules are discovered, so adding a command touches no other file (a module without ``NAME``, such as
`deepgap.commands.session_flags`, is shared by commands, not one). A `UsageError` anywhere becomes
one line on stderr and exit code 2, and so does data from a store that does not decode (an SQLite,
JSON or UTF-8 error that escaped the store's own checks): the line names the stores read.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import pkgutil
import signal
import sqlite3
import sys
import threading
from json import JSONDecodeError
from typing import Any

from deepgap.core.errors import UsageError
from deepgap.core.version import __version__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(2, f"deepgap: error: {message}; see `{self.prog} --help`\n")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """An empty flag value is refused, whatever its type: ``--resume ''``, ``-o ''``, ``--platforms ,``.

        Why here: a flag typed as text takes ``''`` as given, and each command read it its own way
        (``--resume ''`` started a new sweep; ``--trace-dir ''`` wrote into the current folder; ``report
        -o ''`` called the empty name a directory). ``--store`` keeps its own message, shared with positional stores.
        """
        if (
            action.option_strings
            and action.dest not in _OWN_EMPTY_CHECK
            and not arg_string.replace(",", "").strip()
        ):
            fix = "give it a value" if action.required else "give it a value or leave the flag out"
            raise argparse.ArgumentError(None, f"{'/'.join(action.option_strings)} is empty; {fix}")
        return super()._get_value(action, arg_string)


_OWN_EMPTY_CHECK = {"store"}  # an empty store path: `store.check_path` says so, and for positional stores too


def printable(text: str) -> str:
    r"""``text`` as one line, with a path's undecodable bytes and control characters as escapes.

    Printing must not fail (``bad\xff``), a name with a newline must not make two lines, and a
    terminal must not obey what a store or a path holds (`core.terminal`).
    """
    from deepgap.core.terminal import one_line

    return one_line(text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


_LABELS = {"output": "-o", "store": "store", "sides": "input", "stores": "input"}
_STORE_WRITES = {"store", "recover"}  # outputs that are stores (`check --recover` refuses any existing file)


def check_paths(args: argparse.Namespace) -> None:
    """No output of the command replaces any other file it names (`store.paths.check_outputs`).

    A command module names the flags it reads (``READS``) and writes (``WRITES``) by their ``dest``.
    """
    from deepgap.store.paths import check_not_a_store, check_outputs

    def label(dest: str) -> str:
        return _LABELS.get(dest, "--" + dest.replace("_", "-"))

    reads, writes = getattr(args, "_reads", ()), getattr(args, "_writes", ())
    named = {label(d): getattr(args, d, None) for d in (*reads, *writes)}
    named = {k: v for k, v in named.items() if isinstance(v, (str, list, tuple))}
    check_outputs(named, {label(d) for d in writes})
    check_not_a_store({label(d): getattr(args, d, None) for d in writes if d not in _STORE_WRITES})


def build_parser() -> argparse.ArgumentParser:
    """The parser with every discovered sub-command."""
    from deepgap import commands

    parser = _Parser(
        prog="deepgap", description="Inference benchmark for GPUs and CPUs (the DEEP-GAP protocol)."
    )
    parser.add_argument("--version", action="version", version=f"deepgap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    mods = [
        importlib.import_module(f"{commands.__name__}.{m.name}")
        for m in pkgutil.iter_modules(commands.__path__)
    ]
    mods = [m for m in mods if hasattr(m, "NAME")]  # a module without a NAME is shared by commands
    for mod in sorted(mods, key=lambda m: getattr(m, "ORDER", 50)):
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(
            _main=mod.main,
            _reads=getattr(mod, "READS", ()),
            _writes=getattr(mod, "WRITES", ()),
            _raw_stdout=getattr(mod, "RAW_STDOUT", False),
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``deepgap`` console script.

    The edges are quiet: a reader that closed the pipe (``show --json | head -c 10``) ends the
    command without a traceback, output that cannot be written (``> /dev/full``) is one line and
    exit 2, Ctrl-C is one line and exit 130. Console views print through `SafeStream`: a store's
    text never drives the terminal (``RAW_STDOUT`` commands write data, unchanged).
    """
    from deepgap.core.terminal import OutputError, SafeStream

    try:
        os.getcwd()  # every relative path resolves against it: a FileNotFoundError anywhere, later
    except FileNotFoundError:
        print("deepgap: error: the current folder was deleted; cd into an existing folder", file=sys.stderr)
        return 2
    stdout = sys.stdout
    handlers, stopping = _stop_on_signals()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        sys.stdout = SafeStream(stdout, escape=not getattr(args, "_raw_stdout", False))
        try:
            code = _run(parser, args)
            sys.stdout.flush()
        finally:
            sys.stdout = stdout
        return code
    except OutputError as exc:
        if exc.closed:  # the reader went away: nothing more to say, to anyone
            _quiet_stdout()
            return 141
        print(printable(f"deepgap: error: cannot write the output: {exc}"), file=sys.stderr)
        _quiet_stdout()
        return 2
    except KeyboardInterrupt as exc:
        print(f"deepgap: {_stopped(exc)}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    finally:  # after a stop, a repeated signal must not kill the process on its way out
        for sig, old in handlers.items():
            signal.signal(sig, signal.SIG_IGN if stopping else old)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``kill``, systemd, ``docker stop``, a closed terminal), raised like Ctrl-C.

    Why: by default these signals ended the parent on the spot: the run stayed ``running`` and its
    workers measured on, each ending in a traceback. Raised as an exception, they unwind the driver as
    Ctrl-C does: the workers are killed, the run is marked ``interrupted`` (``--resume`` continues it),
    and every finished result is already stored. The exit code is 128 + the signal's number.
    """

    def __init__(self, signum: int) -> None:
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)


def _stop_on_signals() -> tuple[dict[int, Any], list[int]]:
    """Install `Terminated` for SIGTERM and SIGHUP (the main thread only): the old handlers, the signals met.

    A repeated signal (``kill`` five times, systemd's follow-up) is ignored once the first one is
    unwinding: the cleanup that marks the run and stops the workers must not be cut short.
    """
    stopping: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return {}, stopping

    def stop(signum: int, frame: object) -> None:
        if stopping:
            return
        stopping.append(signum)
        raise Terminated(signum)

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}, stopping


def _stopped(exc: BaseException) -> str:
    what = f"stopped by {exc}" if isinstance(exc, Terminated) else "interrupted"
    stored = getattr(exc, "nothing_stored", None)  # set where a run is driven (`deepgap.drive.loop`)
    if stored is None:  # no run under way: nothing to continue
        return what
    if stored:  # before its run began (a worker starting): --resume would find none
        return f"{what} before any run was stored; nothing was written (run the same command again)"
    if not getattr(exc, "resumable", True):  # a serve run: what finished is stored, and it starts anew
        return f"{what}; what finished before the stop is stored, and the run is marked interrupted"
    return f"{what}; finished configurations are stored (continue a run with --resume)"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush has nothing left to fail on."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The command ``args`` names, its errors as one line (see the module doc)."""
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    from deepgap.core import redaction
    from deepgap.store import guard as storeguard

    storeguard.reset()
    redaction.reset()  # a fresh random key per command: two exports never share tokens
    try:
        check_paths(args)
        code = int(args._main(args) or 0)
        if storeguard.skipped_warning():
            print(storeguard.skipped_warning(), file=sys.stderr)
        return code
    except UsageError as exc:
        print(printable(f"deepgap: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except (sqlite3.DatabaseError, ValueError) as exc:  # data read from a store that does not decode
        decode = isinstance(exc, (UnicodeDecodeError, JSONDecodeError)) or storeguard.translatable(exc)
        if not storeguard.OPENED or not decode:
            raise
        paths = ", ".join(dict.fromkeys(storeguard.OPENED))
        why = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"deepgap: error: data read from {paths} cannot be decoded ({type(exc).__name__}: {why}); "
            f"{storeguard.check_hint(storeguard.OPENED[-1])}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as exc:
        print(f"deepgap: {_stopped(exc)}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    finally:  # a command's --redact/--skip-damaged end with it: a later reader in this process reads plainly
        storeguard.reset()
