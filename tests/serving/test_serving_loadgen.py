"""``deepgap serve --loadgen`` on the CPU with the tiny model: MLCommons LoadGen drives the same server in
Server, Offline and SingleStream; its files stay out of the working directory; without the package the
flag is refused (one line, exit 2, nothing written). Plus the server scenario under overload."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clirun import SERVE_SMALL, deepgap_cli

from deepgap.cli import main

pytestmark = pytest.mark.slow


def deepgap(monkeypatch, cwd, *args: str) -> subprocess.CompletedProcess:
    """``deepgap ARGS`` from the folder ``cwd``, through the CLI's main() in this process.

    The served model (and LoadGen, inside it) runs in a worker process, which starts in ``cwd`` too; a
    ``python -m deepgap`` per call cost an interpreter, deepgap's imports and a fork server importing
    torch (10-20 s each on two cores) and checked nothing more.
    """
    monkeypatch.chdir(cwd)
    return deepgap_cli(*args)


@pytest.mark.parametrize(
    "scenario, extra, loadgen_name",
    [
        ("server", ["--qps", "60", "--slo-p99", "200ms"], "Server"),
        ("offline", [], "Offline"),
        ("single-stream", [], "SingleStream"),
    ],
)
def test_loadgen_drives_the_same_server(tmp_path, monkeypatch, scenario, extra, loadgen_name):
    import mlperf_loadgen  # noqa: F401 - the serving extra; CI installs it, so this must not skip

    work = tmp_path / "cwd"
    work.mkdir()
    p = deepgap(
        monkeypatch,
        str(work),
        "serve",
        *SERVE_SMALL,
        "--scenario",
        scenario,
        *extra,
        "--loadgen",
        "--store",
        str(tmp_path / "s.sqlite"),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    lg = out["loadgen"]
    assert lg["Scenario"] == loadgen_name and lg["Mode"] == "PerformanceOnly"
    rate = next(v for k, v in lg.items() if "per second" in k or k.startswith("QPS w/o"))
    assert float(rate) > 0 and lg["Result is"] in ("VALID", "INVALID")
    assert os.listdir(work) == []  # no mlperf_log_* files left in the working directory


def test_loadgen_flag_without_the_package_is_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)  # import fails as if it were not installed
    store = tmp_path / "never.sqlite"
    rc = main(["serve", *SERVE_SMALL, "--scenario", "offline", "--loadgen", "--store", str(store)])
    err = capsys.readouterr().err
    assert rc == 2 and "LoadGen" in err and "pip install" in err and len(err.strip().splitlines()) == 1, err
    assert not store.exists()


def test_overloaded_server_reports_overload_and_does_not_crash(tmp_path, monkeypatch):
    p = deepgap(
        monkeypatch,
        str(tmp_path),
        "serve",
        *SERVE_SMALL,
        "--scenario",
        "server",
        "--qps",
        "20000",
        "--slo-p99",
        "20ms",
        "--store",
        str(tmp_path / "s.sqlite"),
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["status"] == "ok" and out["server_overloaded"] is True
    assert out["server_dropped"] > 0 and out["server_verdict"] == "fail"
    assert out["server_host_mean_s"] > 0


def test_server_steps_down_until_loadgen_calls_it_valid(monkeypatch):
    """LoadGen's Server capacity is the highest VALID rate from deepgap's capacity down (its own search)."""
    from types import SimpleNamespace

    import deepgap.serving.run.loadgen_run as lgmod

    tried = []

    def fake_run(c, spec, policy, qps, minq, mind, null=False):
        if not null:
            tried.append(qps)
        return {"Result is": "VALID" if qps <= 950.0 else "INVALID"}

    monkeypatch.setattr(lgmod, "_one_run", fake_run)
    monkeypatch.setattr(lgmod, "available", lambda: None)
    spec = SimpleNamespace(
        scenario="server",
        max_batch=8,
        max_delay_s=0.001,
        seed=0,
        minimums=lambda: (10, 0.1),
        find_capacity=True,
        confidence=0.99,
        slo_s=0.015,
        loadgen_duration_s=None,
    )
    ctx = SimpleNamespace(
        spec=spec,
        out=SimpleNamespace(
            summary={"capacity_qps": 1000.0, "capacity_max_batch": 8, "capacity_max_delay_s": 0.001}, lines=[]
        ),
        service=SimpleNamespace(max_batch=8),
        rec=SimpleNamespace(levels=[]),
    )
    lgmod.run_loadgen(ctx)
    assert tried == [1000.0, 975.0, 950.0]
    assert ctx.out.summary["loadgen_capacity_qps"] == 950.0
    assert ctx.out.summary["loadgen_capacity_ratio"] == 0.95
    monkeypatch.setattr(lgmod, "_one_run", lambda *a, **k: {"Result is": "INVALID"})
    ctx.out.lines.clear()
    lgmod.run_loadgen(ctx)
    assert ctx.out.summary["loadgen_capacity_qps"] is None and "INVALID at every rate" in ctx.out.lines[-1]
