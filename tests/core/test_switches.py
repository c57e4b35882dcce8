"""`core.switches`: every DEEPGAP_* switch in one torch-free table, read through it, and checked by the parent
before a run writes anything (exit 2, one line), the set ones recorded with the run."""

import json
import re
import sqlite3

import pytest
from clirun import deepgap_cli
from repo_paths import SRC

from deepgap.core import switches
from deepgap.core.errors import UsageError


def _clear(monkeypatch):
    for name in [*switches.SWITCHES, *switches.RETIRED]:
        monkeypatch.delenv(name, raising=False)


def test_unset_switches_read_their_defaults_and_none_is_reported_set(monkeypatch):
    _clear(monkeypatch)
    assert switches.check_environment() == {}
    for name, s in switches.SWITCHES.items():
        assert switches.read(name) == s.default and s.default in s.choices


def test_a_set_switch_is_returned_and_a_bad_one_stops_with_its_fix(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("DEEPGAP_QUANT_GELU", "erf")
    assert switches.check_environment() == {"DEEPGAP_QUANT_GELU": "erf"}
    monkeypatch.setenv("DEEPGAP_DECODE_PDL", "yes")
    with pytest.raises(UsageError, match=r"^DEEPGAP_DECODE_PDL='yes'; set it to one of auto, on, off$"):
        switches.check_environment()


def test_a_retired_switch_set_to_its_removed_lever_stops_the_run(monkeypatch):
    """A lever that was removed never runs silently as the default path: its switch names the removal."""
    _clear(monkeypatch)
    monkeypatch.setenv("DEEPGAP_DECODE_WHOLE", "off")  # the old default: what runs anyway, so no harm
    assert switches.check_environment() == {}
    monkeypatch.setenv("DEEPGAP_DECODE_WHOLE", "on")
    with pytest.raises(UsageError, match=r"^DEEPGAP_DECODE_WHOLE=on: this switch was removed \(session 42: .*"
                       r"; unset DEEPGAP_DECODE_WHOLE$"):  # fmt: skip
        switches.check_environment()
    _clear(monkeypatch)
    monkeypatch.setenv("DEEPGAP_DECODE_ATTENTION", "qkv")  # a removed value of a live switch: its choices
    with pytest.raises(UsageError, match=r"set it to one of triton, sdpa$"):
        switches.check_environment()
    assert not set(switches.RETIRED) & set(switches.SWITCHES)


def test_every_switch_in_the_source_is_read_through_the_table():
    """No DEEPGAP_* switch read past the table (the parent could not check it), none listed but never read."""
    direct, named = [], set()
    for path in (SRC / "deepgap").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name in ("switches.py", "errors.py"):  # the table itself, and the reader it calls
            continue
        direct += [f"{path.name}: {m}" for m in re.findall(r"env_choice\([^)]*", text)]
        named |= set(re.findall(r"\"(DEEPGAP_\w+)\"", text))
    assert not direct, direct
    # each name is written again where it acts (a module's constant or its read), outside the table
    uses = {n for n in named if n in switches.SWITCHES}
    assert uses == set(switches.SWITCHES)


def test_run_refuses_a_bad_switch_before_anything_is_written(tmp_path, monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("DEEPGAP_QUANT_SDPA", "fa3")
    store = tmp_path / "s.sqlite"
    r = deepgap_cli(
        "run", "--models", "tinycnn", "--device", "cpu", "--batch-sizes", "1", "--store", str(store)
    )
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [
        "deepgap: error: DEEPGAP_QUANT_SDPA='fa3'; set it to one of torch, cudnn, flash, efficient"
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_run_records_the_switches_that_were_set(tmp_path, monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("DEEPGAP_QUANT_GELU", "erf")
    store = tmp_path / "s.sqlite"
    args = ("--models", "tinycnn", "--device", "cpu", "--batch-sizes", "1", "--warmup", "1", "--iterations", "2",
            "--repeats", "1", "--no-telemetry", "--idle-time", "0", "--quiet", "--store", str(store))  # fmt: skip
    assert deepgap_cli("run", *args).returncode == 0
    (env,) = [json.loads(r[0]) for r in sqlite3.connect(store).execute("select env_json from runs")]
    assert env["switches"] == {"DEEPGAP_QUANT_GELU": "erf"}
