"""Redaction that cannot be undone (issue 39) and reports redacted by default (issue 35).

The attacker of these tests knows the host name and all but the last five digits of a GPU serial,
and holds the redacted export. With the old unkeyed 48-bit hash, hashing the candidates found both
in under a second; with a keyed 128-bit token under a key nobody kept, no candidate list matches.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
from fixtures_store import build_store
from repo_paths import ROOT

from deepgap.cli import main

HOST = "secret-host-7"
SERIAL = "1651324030793"
UUID = "GPU-a5da2264-0efb-adce-c0b7-57ecf2ae14b3"
NODE = "5f1c0ad2b7e94c3a8d6f1e2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f"
IP = "10.9.8.7"
LANE = f"{HOST} ({NODE[:6]}) cuda:0"
TOKEN = re.compile(r"redacted-[0-9a-f]{32}(?![0-9a-f])")


@pytest.fixture(scope="module")
def private(tmp_path_factory) -> bytes:
    """A store whose runs, results, command lines and telemetry name the host, its GPU and its Ray node."""
    path = tmp_path_factory.mktemp("private") / "s.sqlite"
    runs = build_store(str(path), cpu=False)
    con = sqlite3.connect(path)
    for run_id, env in con.execute("SELECT run_id, env_json FROM runs").fetchall():
        env = {**json.loads(env), "host": HOST, "gpu_serial": SERIAL, "gpu_uuid": UUID}
        con.execute(
            "UPDATE runs SET host = ?, env_json = ?, command = ? WHERE run_id = ?",
            (HOST, json.dumps(env), f"deepgap run --ray {IP}:6379 --store /home/{HOST}/s.sqlite", run_id),
        )
    rid = next(iter(runs["gpu"].result_ids.values()))
    node_env = {"host": HOST, "gpu_uuid": UUID, "lane": LANE, "ray_node_id": NODE, "ray_gpu_ids": ["0"]}
    con.execute(
        "UPDATE results SET extra_json = ?, reason = ? WHERE result_id = ?",
        (json.dumps({"lane": LANE, "node_id": NODE, "node_env": node_env}), f"worker on {HOST} lost", rid),
    )
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    con.execute(
        "INSERT INTO telemetry (run_id, result_id, phase, t_s, data_json) "
        "VALUES (?, NULL, 'idle-summary', 0, ?)",
        (run_id, json.dumps({"settings": {"uuid": UUID, "serial": SERIAL}})),
    )
    con.commit()
    con.close()
    return path.read_bytes()


def _store(tmp_path, private) -> str:
    (tmp_path / "s.sqlite").write_bytes(private)
    return str(tmp_path / "s.sqlite")


def _assert_clean(data: bytes, where: str) -> None:
    for secret in (HOST, SERIAL, UUID, NODE, NODE[:6], IP):
        assert secret.encode() not in data, f"{secret} in {where}"


def _export(store: str, tmp_path, name: str) -> str:
    out = tmp_path / name
    assert main(["export", store, "--redact", "-o", str(out)]) == 0
    return out.read_text()


def test_no_identifier_left_in_an_export(tmp_path, capsys, private):
    text = _export(_store(tmp_path, private), tmp_path, "x.csv")
    _assert_clean(text.encode(), "export")
    hosts = {row["host"] for row in csv.DictReader(io.StringIO(text))}
    assert len(hosts) == 1 and TOKEN.fullmatch(hosts.pop())  # one machine is one 128-bit token


def test_no_identifier_left_after_merge_redact(tmp_path, capsys, private):
    """Lanes, node ids, command lines, reasons, telemetry: nothing names the machine (freed pages too)."""
    s = _store(tmp_path, private)
    out = str(tmp_path / "all.sqlite")
    assert main(["merge", s, "-o", out, "--redact"]) == 0
    _assert_clean(Path(out).read_bytes(), "merged store")
    assert main(["merge", s, "-o", s, "--redact"]) == 0  # in place
    _assert_clean(Path(s).read_bytes(), "store redacted in place")


def test_two_exports_give_different_tokens(tmp_path, capsys, private):
    """A random key per command: the same host gets unrelated tokens in two exports (nothing to correlate)."""
    s = _store(tmp_path, private)
    first = set(TOKEN.findall(_export(s, tmp_path, "a.csv")))
    second = set(TOKEN.findall(_export(s, tmp_path, "b.csv")))
    assert first and second and not first & second


def test_a_dictionary_of_candidates_does_not_match(tmp_path, capsys, private):
    """The host name and a 8-digit serial prefix known: hashing every candidate finds no token."""
    s = _store(tmp_path, private)
    out = str(tmp_path / "all.sqlite")
    assert main(["merge", s, "-o", out, "--redact"]) == 0
    raw = Path(out).read_bytes().decode("utf-8", "replace")
    text = _export(s, tmp_path, "x.csv")
    data = raw + text
    candidates = [HOST, UUID, NODE, *(SERIAL[:8] + f"{i:05d}" for i in range(100_000))]
    found = set(re.findall(r"redacted-[0-9a-f]+", data))
    for c in candidates:  # the old unkeyed scheme, and a plain hash of the value
        assert "redacted-" + hashlib.sha256(f"deepgap-redact:{c}".encode()).hexdigest()[:12] not in found, c
        assert "redacted-" + hashlib.sha256(c.encode()).hexdigest()[:32] not in found, c
    # every token is 128 bits: in the export's text exactly; in the raw store file no token is shorter (a
    # token there may be followed by a record byte that reads as a hex digit, so longer runs are not tokens)
    in_text = set(re.findall(r"redacted-[0-9a-f]+", text))
    assert in_text and all(TOKEN.fullmatch(t) for t in in_text), in_text
    assert not re.findall(r"redacted-[0-9a-f]{0,31}(?![0-9a-f])", raw), "a token shorter than 128 bits"


def test_key_from_the_environment_gives_stable_tokens(monkeypatch):
    """DEEPGAP_REDACT_KEY: one's own secret key makes tokens comparable across commands."""
    from deepgap.core import redaction

    monkeypatch.setenv(redaction.KEY_ENV, "a secret of our own")
    assert redaction.reset().token(HOST) == redaction.reset().token(HOST)
    monkeypatch.delenv(redaction.KEY_ENV)
    assert redaction.reset().token(HOST) != redaction.reset().token(HOST)


def test_redactor_scrubs_text_and_keeps_versions():
    from deepgap.core.redaction import Redactor

    r = Redactor(b"k")
    env = r.tree(
        {
            "host": HOST,
            "node_env": {"ray_node_id": NODE},
            "lane": LANE,
            "tensorrt": "10.0.1.6",
            "gpu_serial": "unavailable: not supported",
            "command": f"--ray {IP}:6379 {UUID}",
        }
    )
    text = json.dumps(env)
    _assert_clean(text.encode(), "redacted tree")
    assert env["tensorrt"] == "10.0.1.6" and env["gpu_serial"] == "unavailable: not supported"
    assert env["lane"].endswith(" cuda:0") and r.tree(env) == env  # redacting twice changes nothing
    old = "redacted-" + hashlib.sha256(b"deepgap-redact:vm").hexdigest()[:12]  # committed stores' host token
    assert old not in r.text(f"host {old}")


def test_a_measurement_under_an_identifier_key_is_kept():
    """The quant engine's branch choice stores its serial graph's time as ``seconds.serial``: a float is
    never a machine identifier, so it survives redaction, and its digits never become a scrub pattern."""
    from deepgap.core.redaction import Redactor

    r = Redactor(b"k")
    info = {"host": HOST, "branch": {"seconds": {"serial": 0.000268, "branched": 0.000255}}}
    out = r.tree(info)
    assert out["branch"] == info["branch"] and out["host"] != HOST
    assert r.text("serial 0.000268 ms") == "serial 0.000268 ms"
    assert r.tree({"serial": "1324021034567"})["serial"].startswith("redacted-")  # a string serial still goes


def test_report_is_redacted_unless_asked(tmp_path, capsys, private, monkeypatch):
    """Issue 35: a report omits serials and UUIDs by default; --no-redact shows them; the header path too."""
    import deepgap.report.page
    from deepgap.store import guard

    seen = []

    def write(store_path, html_path, run_ids=None, static=False):
        seen.append((guard.READ["redact"], deepgap.report.page.shown_store_path(store_path)))
        return [html_path]

    monkeypatch.setattr(deepgap.report.page, "write_report", write)
    s = _store(tmp_path, private)
    assert main(["report", s, "-o", str(tmp_path / "r.html")]) == 0
    assert main(["report", s, "--no-redact", "-o", str(tmp_path / "r.html")]) == 0
    assert seen == [(True, "s.sqlite"), (False, s)]
    assert main(["report", s, "--redact", "--no-redact", "-o", str(tmp_path / "r.html")]) == 2


def test_committed_text_results_hold_no_raw_gpu_identifier():
    """Small committed text files in results/ hold no GPU UUID, serial or old (reversible) serial token."""
    root = ROOT
    listed = subprocess.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True)
    files = listed.stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    uuid = re.compile(rb"(?:GPU|MIG)-[0-9a-f]{8}")  # a UUID, or its first 8 digits in a log line
    serial = re.compile(rb"gpu_serial\W{1,20}[0-9]{6,}")
    old_token = re.compile(rb"redacted-[0-9a-f]{12}(?![0-9a-f])")  # reversible: a serial comes back in 0.07 s
    for name in files:
        p = root / name
        if not p.is_file() or p.stat().st_size >= 1 << 20 or p.suffix in (".sqlite", ".gz", ".png"):
            continue
        data = p.read_bytes()
        assert not uuid.search(data), name
        assert not serial.search(data), name
        if b"gpu_serial" in data or b"gpu_uuid" in data:
            assert not old_token.search(data), name
