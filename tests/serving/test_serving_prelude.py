"""``deepgap serve`` gets the run-level prelude of ``deepgap run``: idle baseline and thermal warm-up.

On the CPU with the tiny CNN and the scripted telemetry backend (`deepgap.measure.telemetry.fake`, which draws
100 W idle and warms up to a steady clock of 1100 MHz), through a real serving worker process.
"""

from __future__ import annotations

import pytest

from deepgap.core.errors import UsageError
from deepgap.store import Store

pytestmark = pytest.mark.slow

FAST = dict(
    model="tinycnn",
    engine="eager",
    precision="fp32",
    device="cpu",
    threads=1,
    batch_sizes=(1, 2),
    curve_iterations=5,
    scenario="single-stream",
    min_queries=32,
    min_duration_s=0.1,
    telemetry_backend="fake:throttle",
    idle_s=0.2,
    sample_hz=50.0,
)


def _serve(tmp_path, **changes):
    from deepgap.serving.run.serve_run import run_serve
    from deepgap.serving.run.spec import ServeSpec

    path = str(tmp_path / "serve.sqlite")
    said: list[str] = []
    out = run_serve(ServeSpec(**{**FAST, **changes}), path, say=said.append, command="deepgap serve (test)")
    return path, out, said


def _stored(path: str, run_id: str):
    from deepgap.drive.prelude import run_summaries
    from deepgap.serving.records.storage import levels_frame

    s = Store(path, readonly=True)
    try:
        return s.run(run_id), run_summaries(s, run_id), s.run_telemetry(run_id), levels_frame(s, [run_id])
    finally:
        s.close()


def test_serve_stores_its_idle_baseline_and_thermal_warmup(tmp_path):
    path, out, said = _serve(tmp_path, thermal_warmup=True, thermal_window_s=0.3, thermal_timeout_s=5.0)
    assert out.status == "ok", out.reason
    run, summ, tel, lv = _stored(path, out.run_id)
    assert run["kind"] == "serve" and run["status"] == "finished"
    assert [i["status"] for i in summ["idle"]] == ["ok"]
    assert summ["idle"][0]["idle_power_w"] == pytest.approx(100.0, rel=0.05)
    assert [t["status"] for t in summ["thermal"]] == ["ok"]
    assert summ["thermal"][0]["steady_sm_clock_mhz"] == 1100.0
    phases = {p for p, _, _ in tel}
    assert {"idle", "thermal", "idle-summary", "thermal-summary"} <= phases  # the samples too, as for sweeps
    assert len(lv) == 1 and lv["status"].iloc[0] == "ok"  # the level belongs to the same run
    assert run["spec"]["thermal_warmup"] is True and run["spec"]["idle_s"] == 0.2
    first = [m for m in said if "idle baseline" in m or "thermal warm-up" in m or "building" in m]
    assert first[0].startswith("serve: idle baseline") and first[-1].startswith("serve: building"), said


def test_serve_without_thermal_warmup_stores_the_idle_baseline_only(tmp_path):
    path, out, _ = _serve(tmp_path)
    run, summ, _, _ = _stored(path, out.run_id)
    assert run["status"] == "finished" and run["spec"]["thermal_warmup"] is False
    assert [i["status"] for i in summ["idle"]] == ["ok"] and summ["thermal"] == []


def test_an_interrupted_serve_keeps_its_run_and_prelude_interrupted(tmp_path, monkeypatch):
    """Interrupted after the prelude, in the build: the run row stays ``interrupted``, with no levels."""
    from deepgap.serving.run.process import ServingWorker

    def interrupted(self, req, timeout_s, say=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ServingWorker, "setup", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _serve(tmp_path)
    s = Store(str(tmp_path / "serve.sqlite"), readonly=True)
    try:
        (run,) = s.runs()
        assert s.latest_unfinished() is None  # an interrupted serve is not a sweep to resume
    finally:
        s.close()
    run, summ, _, lv = _stored(str(tmp_path / "serve.sqlite"), run["run_id"])
    assert (run["kind"], run["status"]) == ("serve", "interrupted")
    assert [i["status"] for i in summ["idle"]] == ["ok"] and len(lv) == 0


def test_serve_prelude_flags_reach_the_spec():
    """``deepgap serve`` takes ``deepgap run``'s prelude flags, with its defaults."""
    import argparse

    from deepgap.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    spec = serve.build_spec(p.parse_args(["--model", "tinycnn", "--scenario", "single-stream"]))
    defaults = (spec.telemetry, spec.idle_s, spec.thermal_warmup, spec.thermal_timeout_s)
    assert defaults == (True, 2.0, False, 120.0)  # no GPU here: no warm-up by default
    on_gpu = serve.build_spec(p.parse_args(["--model", "tinycnn", "--device", "cuda"]))
    assert on_gpu.thermal_warmup is True  # a GPU warms up unless told not to
    off = serve.build_spec(p.parse_args(["--model", "tinycnn", "--device", "cuda", "--no-thermal-warmup"]))
    assert off.thermal_warmup is False
    with pytest.raises(UsageError, match="contradict"):
        serve.build_spec(p.parse_args(["--model", "tinycnn", "--thermal-warmup", "--no-thermal-warmup"]))
    spec = serve.build_spec(
        p.parse_args(
            [
                "--model",
                "tinycnn",
                "--thermal-warmup",
                "--thermal-timeout",
                "20",
                "--idle-time",
                "0",
                "--thermal-window",
                "5",
            ]
        )
    )
    given = (spec.telemetry, spec.idle_s, spec.thermal_warmup, spec.thermal_timeout_s, spec.thermal_window_s)
    assert given == (True, 0.0, True, 20.0, 5.0)
    quiet = serve.build_spec(p.parse_args(["--model", "tinycnn", "--idle-time", "0", "--no-telemetry"]))
    assert (quiet.telemetry, quiet.idle_s) == (False, 0.0)
    with pytest.raises(UsageError, match="--no-telemetry takes no samples"):  # a warm-up needs telemetry
        serve.build_spec(p.parse_args(["--model", "tinycnn", "--thermal-warmup", "--no-telemetry"]))
