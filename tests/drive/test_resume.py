"""SIGKILL a real sweep mid-run, then --resume: every configuration exactly once, no partial rows."""

import os
import signal
import sqlite3
import time

import pytest
from clirun import deepgap_process

from deepgap.cli import main
from deepgap.store import Store


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    argv = [
        "run",
        "--models",
        "tinycnn",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-sizes",
        "1,2,3,4,5,6,7,8",
        "--warmup",
        "1",
        "--iterations",
        "40",
        "--repeats",
        "2",
        "--target-ci",
        "off",
        "--store",
        store,
        "--quiet",
    ]
    proc = deepgap_process(*argv)
    deadline = time.time() + 600  # a bound for a broken sweep only: the loop ends as soon as two are stored
    done = 0
    while time.time() < deadline:  # wait until some, but not all, configurations are stored
        time.sleep(0.2)
        if os.path.exists(store):
            try:
                con = sqlite3.connect(store, timeout=5)
                done = con.execute("SELECT count(*) FROM results").fetchone()[0]
                con.close()
            except sqlite3.OperationalError:
                continue
            if done >= 2:
                break
    assert 2 <= done < 8, f"could not catch the sweep mid-run (done={done})"
    os.killpg(proc.pid, signal.SIGKILL)  # parent and worker, no chance to clean up
    proc.wait(10)
    s = Store(store, readonly=True)
    killed = s.results_frame()
    assert s.runs()[0]["status"] == "running"
    n_killed = len(killed)
    s.close()
    # only the killed sweep needs its own process; resuming runs in this one, through the CLI's main()
    assert main(["run", "--resume", "--store", store, "--quiet"]) == 0, capsys.readouterr().err
    s = Store(store, readonly=True)
    df = s.results_frame()
    assert len(s.runs()) == 1 and s.runs()[0]["status"] == "finished"
    assert sorted(df["batch_size"]) == list(range(1, 9)) and df["config_key"].is_unique
    assert (df["status"] == "ok").all() and len(df) > n_killed
    for rid in df["result_id"]:  # every stored configuration has all its samples
        assert [len(a) for a in s.samples(int(rid))] == [40, 40]
    # resuming a finished store says so, and writes nothing
    capsys.readouterr()
    assert main(["run", "--resume", "--store", store]) == 2
    assert "no unfinished run" in capsys.readouterr().err
