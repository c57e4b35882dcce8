"""Issue 46: a store's text never drives the terminal, and the CLI's edges are quiet.

Before: ``show`` printed a model name's escape sequences raw (the terminal was retitled and cleared),
a name with a newline made a two-line error, ``show --json | head -c 10`` and ``> /dev/full`` ended
in tracebacks.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
from clirun import deepgap_cli
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.core.terminal import SafeStream

EVIL = "evil\x1b]0;title\x07\x1b[2J"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("evil") / "e.sqlite")
    build_store(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE results SET model = ? WHERE model = 'resnet18'", (EVIL,))
    con.execute("UPDATE runs SET command = ?", ("deepgap run\x1b[1A\x1b[2K\rnothing to see",))
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize(
    "argv",
    [["show", "{s}", "--all"], ["show", "{s}", "--runs"], ["recommend", "{s}"], ["compare", "{s}", "{s}"]],
)
def test_console_views_escape_a_stores_control_characters(hostile, argv):
    r = deepgap_cli(*[a.format(s=hostile) for a in argv])
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert not [c for c in out if ord(c) < 32 and c not in "\n"], repr(out[:400])
    assert "\\x1b" in out


def test_on_a_terminal_only_colour_passes():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    SafeStream(tty).write("\x1b[1mbold\x1b[0m " + EVIL + "\r\n")
    assert tty.getvalue() == "\x1b[1mbold\x1b[0m evil\\x1b]0;title\\x07\\x1b[2J\\r\n"


def test_a_name_with_a_newline_is_a_one_line_error(tmp_path):
    r = deepgap_cli("show", str(tmp_path / "a\nb\x1b[2J.sqlite"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "a\\nb\\x1b[2J" in r.stderr, r.stderr


class Failing(io.StringIO):
    def __init__(self, err: OSError):
        super().__init__()
        self.err = err

    def write(self, text):
        raise self.err


@pytest.mark.parametrize(
    ("err", "code"),
    [(BrokenPipeError(errno.EPIPE, "Broken pipe"), 141), (OSError(errno.ENOSPC, "No space"), 2)],
)
@pytest.mark.parametrize("command", [["show", "{s}", "--json"], ["export", "{s}", "-o", "-"]])
def test_a_closed_pipe_is_quiet_and_a_full_disk_one_line(hostile, monkeypatch, capsys, err, code, command):
    monkeypatch.setattr(sys, "stdout", Failing(err))
    assert main([a.format(s=hostile) for a in command]) == code
    lines = capsys.readouterr().err.splitlines()
    assert lines == ([] if code == 141 else ["deepgap: error: cannot write the output: No space"])


def test_ctrl_c_is_one_line_and_130(hostile, monkeypatch, capsys):
    import deepgap.commands.show as show

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(show, "main", interrupted)
    assert main(["show", hostile]) == 130
    assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.skipif(not shutil.which("head"), reason="a POSIX shell's tools")
def test_a_real_closed_pipe_leaves_no_traceback(hostile):
    """The interpreter's own last flush must not print a traceback either (a real process)."""
    cmd = [sys.executable, "-m", "deepgap", "show", hostile, "--all", "--json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader goes away before the output comes, as `| head -c 10` does after 10 bytes
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and err == "", err


def test_a_deleted_working_folder_is_one_line(tmp_path, capsys, hostile):
    gone = tmp_path / "gone"
    gone.mkdir()
    cwd = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        assert main(["show", "s.sqlite"]) == 2
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().err.splitlines() == [
        "deepgap: error: the current folder was deleted; cd into an existing folder"
    ]
