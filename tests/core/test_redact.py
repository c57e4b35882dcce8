"""Shared stores and reports: --redact hides host names and GPU serials; untrusted strings render as text."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest
from fixtures_store import build_store

from deepgap.cli import main
from deepgap.core.envinfo import redact, redact_value

SECRETS = {"host": "secret-host-7", "gpu_serial": "1651324030793", "gpu_uuid": "GPU-a5da2264-0efb-adce"}


def _no_png(fig, dpi: int = 90) -> bytes:
    import matplotlib.pyplot as plt

    plt.close(fig)
    return b""


@pytest.fixture(autouse=True)
def no_png(monkeypatch):
    import deepgap.render.draw

    monkeypatch.setattr(deepgap.render.draw, "png_bytes", _no_png)  # rasterising is slow and not under test


def _private_store(path: str) -> str:
    """A fixture store whose runs and one result carry a host name, a GPU serial and a UUID."""
    runs = build_store(path)
    con = sqlite3.connect(path)
    for run_id, env in con.execute("SELECT run_id, env_json FROM runs").fetchall():
        env = {**json.loads(env), **SECRETS}
        con.execute(
            "UPDATE runs SET host = ?, env_json = ? WHERE run_id = ?",
            (SECRETS["host"], json.dumps(env), run_id),
        )
    rid = next(iter(runs["gpu"].result_ids.values()))
    con.execute(
        "UPDATE results SET extra_json = ? WHERE result_id = ?",
        (json.dumps({"node_env": {"host": SECRETS["host"], "gpu_uuid": SECRETS["gpu_uuid"]}}), rid),
    )
    # NVML's settings as the telemetry layer stores them with the idle summary
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    con.execute(
        "INSERT INTO telemetry (run_id, result_id, phase, t_s, data_json) "
        "VALUES (?, NULL, 'idle-summary', 0, ?)",
        (run_id, json.dumps({"settings": {"uuid": SECRETS["gpu_uuid"], "serial": SECRETS["gpu_serial"]}})),
    )
    con.commit()
    con.close()
    return path


def _assert_no_secrets(data: bytes, where: str) -> None:
    for v in SECRETS.values():
        assert v.encode() not in data, f"{v} in {where}"


def test_redact_value_is_stable_and_hides():
    h = redact_value("secret-host-7")
    assert h == redact_value("secret-host-7") != redact_value("secret-host-8")
    assert "secret" not in h and h.startswith("redacted-")
    assert redact_value(h) == h  # redacting twice changes nothing
    env = redact({"host": "a", "gpus": [{"gpu_serial": "1"}], "device_name": "H100"})
    assert env["device_name"] == "H100" and env["host"] == redact_value("a")
    assert env["gpus"][0]["gpu_serial"] == redact_value("1")
    kept = {"gpu_serial": "unavailable: not supported"}
    assert redact(kept) == kept


def test_export_redact(tmp_path, capsys):
    s = _private_store(str(tmp_path / "s.sqlite"))
    out = tmp_path / "x.csv"
    assert main(["export", s, "--redact", "-o", str(out)]) == 0
    text = out.read_bytes()
    _assert_no_secrets(text, "export")
    assert redact_value(SECRETS["host"]).encode() in text  # one machine is still one (stable hash)
    assert main(["export", s, "-o", str(out)]) == 0
    _assert_no_secrets(out.read_bytes(), "export")  # redacted by default (issue 49)
    assert main(["export", s, "--no-redact", "-o", str(out)]) == 0
    assert SECRETS["host"].encode() in out.read_bytes()  # --no-redact: nothing is hidden


def test_a_commands_redact_ends_with_it(tmp_path, capsys):
    """``export --redact`` run in process leaves later readers in that process reading plainly.

    The reading options are process-wide (`store.guard.READ`); a command that set them had left them set,
    so a test after it in the same xdist worker read a redacted GPU card (session 18, six workers).
    """
    from deepgap.store import Store, guard

    s = _private_store(str(tmp_path / "s.sqlite"))
    assert main(["export", s, "--redact", "-o", str(tmp_path / "x.csv")]) == 0
    assert guard.READ == {"skip_damaged": False, "redact": False}
    assert SECRETS["host"] in {r["host"] for r in Store(s, readonly=True).runs()}


def test_report_redact(tmp_path, capsys):
    s = _private_store(str(tmp_path / "s.sqlite"))
    html = tmp_path / "r" / "r.html"
    assert main(["report", s, "--redact", "-o", str(html)]) == 0
    for root, _, files in os.walk(html.parent):
        for f in files:
            _assert_no_secrets(Path(root, f).read_bytes(), f)
    assert redact_value(SECRETS["host"]).encode() in html.read_bytes()


def test_merge_redact_leaves_no_trace_in_the_file(tmp_path, capsys):
    a = _private_store(str(tmp_path / "a.sqlite"))
    out = str(tmp_path / "all.sqlite")
    assert main(["merge", a, "-o", out, "--redact"]) == 0
    _assert_no_secrets(Path(out).read_bytes(), "merged store bytes")
    con = sqlite3.connect(f"file:{out}?immutable=1", uri=True)
    hosts = {h for (h,) in con.execute("SELECT host FROM runs")}
    assert hosts == {redact_value(SECRETS["host"])}
    con.close()
    # in place: merge S -o S --redact
    b = _private_store(str(tmp_path / "b.sqlite"))
    assert main(["merge", b, "-o", b, "--redact"]) == 0
    _assert_no_secrets(Path(b).read_bytes(), "store redacted in place")
    assert sorted(os.listdir(tmp_path)) == ["a.sqlite", "all.sqlite", "b.sqlite"]


def test_report_renders_untrusted_strings_as_text(tmp_path, capsys):
    """A store from another machine is untrusted input: its strings must never become markup."""
    s = str(tmp_path / "s.sqlite")
    build_store(s)
    evil = {
        "model": "<script>alert('m')</script>",
        "engine": "<img src=x onerror=alert('e')>",
        "host": "<script>alert('h')</script>",
    }
    con = sqlite3.connect(s)
    con.execute(
        "UPDATE results SET model = ?, engine = ? WHERE result_id = 1", (evil["model"], evil["engine"])
    )
    for run_id, env in con.execute("SELECT run_id, env_json FROM runs").fetchall():
        env = {**json.loads(env), "host": evil["host"], "device_name": "<b>GPU</b>"}
        con.execute(
            "UPDATE runs SET host = ?, env_json = ? WHERE run_id = ?", (evil["host"], json.dumps(env), run_id)
        )
    con.commit()
    con.close()
    html = tmp_path / "r.html"
    assert main(["report", s, "-o", str(html)]) == 0
    page = html.read_text()
    for v in (*evil.values(), "<b>GPU</b>"):
        assert v not in page
    assert "&lt;script&gt;alert(" in page  # shown, as text
    # as text: HTML-escaped in tables, JSON-escaped in the plot specs (which hold no raw "<" at all)
    shown = page.replace("&lt;img src=x onerror=alert", "").replace("\\u003cimg src=x onerror=alert", "")
    assert "onerror=alert" not in shown
    specs = re.findall(r'class="plot-spec"[^>]*>(.*?)</script>', page, flags=re.S)
    assert specs and not any("<" in spec for spec in specs)
