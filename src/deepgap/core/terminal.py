r"""Text from stores, made safe for a terminal: control characters shown as escapes, never obeyed.

Why: stores are made to be merged across machines, so their text (a model name, a host, a command
line) is someone else's input. Printed raw, a model name holding ``ESC ] 0 ; … BEL`` retitled the
terminal, ``ESC [ 2 J`` cleared it and a carriage return hid what a command printed before it. The CLI
writes every console view through `SafeStream` (`deepgap.cli`); ``export -o -``, whose output is
the data itself, is written unchanged.
"""

from __future__ import annotations

import errno
import re
from typing import Any, TextIO

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but tab and newline
_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # newline and tab too: an error is one line
_SGR = re.compile(r"(\x1b\[[0-9;]*m)")  # colour and weight, as rich writes them to a terminal


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or f"\\x{ord(c):02x}"


def escape_controls(text: str) -> str:
    r"""``text`` with every control character but newline and tab as a visible escape (``\x1b``)."""
    return _CONTROLS.sub(_escape, text)


def one_line(text: str) -> str:
    """``text`` as one line: newlines, tabs and every other control character as visible escapes."""
    return _LINE.sub(_escape, text)


class OutputError(Exception):
    """Standard output failed: ``closed`` when the reader went away (a pipe), else why (a full disk)."""

    def __init__(self, exc: OSError) -> None:
        self.closed = isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE
        super().__init__(exc.strerror or str(exc))


class SafeStream:
    """A text stream that escapes control characters before they reach the terminal (or a pipe).

    On a terminal, the SGR sequences the table renderer writes (colour, bold) pass; everything else
    that a terminal would obey is escaped. ``isatty`` and the rest are the wrapped stream's own.
    """

    def __init__(self, stream: TextIO, escape: bool = True) -> None:
        self._stream = stream
        self._escape = escape
        try:
            self._tty = bool(stream.isatty())
        except (AttributeError, ValueError, OSError):
            self._tty = False

    def write(self, text: str) -> int:  # noqa: D102
        if not self._escape:
            safe = text
        elif self._tty:
            safe = "".join(p if i % 2 else escape_controls(p) for i, p in enumerate(_SGR.split(text)))
        else:
            safe = escape_controls(text)
        try:
            self._stream.write(safe)
        except OSError as exc:
            raise OutputError(exc) from None
        return len(text)

    def flush(self) -> None:  # noqa: D102
        try:
            self._stream.flush()
        except OSError as exc:
            raise OutputError(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
