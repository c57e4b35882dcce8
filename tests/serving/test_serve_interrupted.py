"""A stopped `serve --find-capacity` keeps the levels it had finished (session 33).

Before, a serve run stored its levels in one transaction at its end: a capacity search stopped after
minutes of probes kept its run row (``interrupted``) and none of the probes, each a whole measurement.
One real search is stopped here, by SIGTERM once its second probe has begun (a signal needs a process
of its own). Every wait ends on a state, with a generous bound; nothing asserts how long anything took.
"""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
from clirun import deepgap_process

from deepgap.cli import main
from deepgap.store import Store

BOUND_S = 600  # bounds a broken run only: the host is shared


@pytest.mark.slow
def test_a_stopped_capacity_search_stores_its_finished_probes(tmp_path, capsys):
    store = str(tmp_path / "s.sqlite")
    argv = ["serve", "--model", "tinycnn", "--engine", "eager", "--precision", "fp32", "--device", "cpu"]
    argv += ["--threads", "1", "--batch-sizes", "1,2,4", "--curve-iterations", "5", "--scenario", "server"]
    # each probe serves at least 2 s of arrivals: the stop lands inside the second one, not after the search
    argv += ["--find-capacity", "--slo-p99", "250ms", "--verify-policies", "2", "--no-telemetry"]
    argv += ["--store", store]
    proc = deepgap_process(*argv, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    second_probe = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if sum("queries/s (" in x for x in lines) >= 2:  # a probe's opening line: the first has finished
                second_probe.set()
        second_probe.set()  # the process ended: the assertions below say how

    threading.Thread(target=read, daemon=True).start()
    assert second_probe.wait(BOUND_S)
    assert proc.poll() is None, "".join(lines)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(BOUND_S) == 128 + signal.SIGTERM, "".join(lines)
    last = lines[-1]
    assert "stopped by SIGTERM; what finished before the stop is stored" in last and "--resume" not in last
    assert not any("Traceback" in x for x in lines), "".join(lines)
    s = Store(store, readonly=True)
    try:
        assert [r["status"] for r in s.runs()] == ["interrupted"]
        from deepgap.serving.records.storage import capacity_frame, levels_frame

        lv = levels_frame(s)
        assert len(capacity_frame(s)) == 0  # the search did not end: no capacity is claimed
    finally:
        s.close()
    probes = lv[lv["scenario"] == "server"]
    assert len(probes) >= 1 and (probes["n"] > 0).all() and probes["verdict"].notna().all()
    assert main(["show", store]) == 0  # the kept probes read as any serve run's levels
    assert "was stopped before it finished" in capsys.readouterr().out  # and said to be a stopped run's
