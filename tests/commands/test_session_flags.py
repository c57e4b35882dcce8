"""The run session's flags: one declaration (`deepgap.commands.session_flags`) for every command that runs
something — the same flags, one type and one help each — with each command's own defaults kept."""

from __future__ import annotations

import argparse
import re

import pytest

from deepgap.cli import build_parser, main
from deepgap.commands.session_flags import WARMUP_FLAGS, read_session_arguments
from deepgap.core.errors import UsageError
from deepgap.drive.prelude import PreludeSettings

RUNNING = ("run", "serve", "profile", "peaks")
SESSION = ("--store", "--quiet", "--no-telemetry", "--idle-time", "--sample-hz", *WARMUP_FLAGS)


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _shape(a: argparse.Action) -> tuple:
    """What must agree between commands: the action, its type, default, nargs, and help but its default."""
    help_ = re.sub(r"\(default[^)]*\)", "(default …)", a.help or "")
    return type(a).__name__, a.type, a.default, a.nargs, a.const, help_


def test_every_running_command_has_the_same_session_flags_with_one_type_each():
    commands = _commands()
    shapes: dict[str, set[tuple]] = {}
    for name in RUNNING:
        flags = _flags(commands[name])
        wanted = [f for f in SESSION if name != "peaks" or f not in WARMUP_FLAGS]  # peaks cannot warm up
        assert set(wanted) <= set(flags), f"{name} lacks {set(wanted) - set(flags)}"
        if name == "peaks":
            assert not set(WARMUP_FLAGS) & set(flags)
        for f in wanted:
            shapes.setdefault(f, set()).add(_shape(flags[f]))
    assert {f: s for f, s in shapes.items() if len(s) > 1} == {}  # one shape per flag
    assert {s[1] for f in ("--idle-time", "--thermal-timeout") for s in shapes[f]} == {None}  # parsed later
    others = {n: p for n, p in commands.items() if n not in RUNNING}
    for name, parser in others.items():  # a command that gains a prelude flag must take the whole group
        assert not {"--idle-time", "--thermal-warmup"} & set(_flags(parser)), name


def test_the_help_shows_each_commands_own_defaults():
    commands = _commands()
    timeout = {n: _flags(commands[n])["--thermal-timeout"].help for n in ("run", "serve", "profile")}
    assert "(default 300)" in timeout["run"] and "(default 300)" in timeout["profile"]
    assert "(default 120)" in timeout["serve"]  # ServeSpec's bound, as the default sweep's
    warm = {n: _flags(commands[n])["--thermal-warmup"].help for n in ("run", "serve", "profile")}
    assert "on a GPU" in warm["serve"] and "(default: off)" in warm["profile"] and "preset" in warm["run"]


def _args(command: str, *argv: str) -> argparse.Namespace:
    return _commands()[command].parse_args(list(argv))


def test_the_reader_types_the_settings_and_a_flag_left_out_keeps_the_commands_default():
    got = read_session_arguments(_args("profile", "--idle-time", "0.5", "--thermal-warmup"))
    assert got.prelude == PreludeSettings(idle_s=0.5, thermal_warmup=True)
    got = read_session_arguments(_args("profile", "--idle-time", "0", "--no-telemetry"))  # "none" twice: fine
    assert got.prelude == PreludeSettings(telemetry=False, idle_s=0.0)
    for extra in (
        ["--thermal-warmup"],
        ["--sample-hz", "50"],
        ["--idle-time", "5"],
        ["--thermal-window", "30"],
    ):
        with pytest.raises(
            UsageError, match=f"--no-telemetry takes no samples, but {extra[0]} asks for them"
        ):
            read_session_arguments(_args("run", "--no-telemetry", *extra))  # session 33: all were accepted
    assert read_session_arguments(_args("peaks")).prelude.changes() == {}  # SweepSpec's defaults stand
    with pytest.raises(UsageError, match="contradict"):
        read_session_arguments(_args("run", "--thermal-warmup", "--no-thermal-warmup"))
    with pytest.raises(UsageError, match=r"--sample-hz 'x' is not a number"):
        read_session_arguments(_args("serve", "--sample-hz", "x"))


def test_run_and_serve_keep_their_defaults_and_take_the_flags():
    from deepgap.commands import run, serve

    gpu = run.build_spec(_args("run", "--preset", "gpu"))
    assert gpu.thermal_warmup and gpu.thermal_timeout_s == 120.0  # the preset's warm-up, as before
    assert not run.build_spec(_args("run", "--preset", "gpu", "--no-thermal-warmup")).thermal_warmup
    quick = run.build_spec(_args("run", "--preset", "quick", "--idle-time", "0", "--thermal-window", "5"))
    assert (quick.idle_s, quick.thermal_warmup, quick.thermal_window_s) == (0.0, False, 5.0)
    s = serve.build_spec(_args("serve", "--model", "tinycnn", "--device", "cpu"))
    assert (s.telemetry, s.idle_s, s.thermal_warmup, s.thermal_timeout_s) == (True, 2.0, False, 120.0)


@pytest.mark.parametrize("command", RUNNING)
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--idle-time", "x"], "--idle-time 'x' is not a number"),
        (["--sample-hz", "inf"], "--sample-hz 'inf' is not a finite number"),
        (["--idle-time", "-1"], "idle"),
    ],
)
def test_a_bad_session_flag_is_one_line_exit_2_and_writes_nothing(command, flags, needle, tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    extra = {"run": ["--preset", "quick", "--device", "cpu"], "serve": ["--device", "cpu"]}.get(command, [])
    extra += ["--device", "cpu"] if command in ("profile", "peaks") else []
    assert main([command, *extra, *flags, "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
    assert not store.exists() and list(tmp_path.iterdir()) == []


def test_profile_and_peaks_keep_their_idle_time_message(tmp_path, capsys):
    for command in ("profile", "peaks"):
        assert main([command, "--device", "cpu", "--idle-time", "-1", "--store", str(tmp_path / "s")]) == 2
        assert "--idle-time must be 0 or more, not -1.0" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
