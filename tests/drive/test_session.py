"""The run session: every kind of run gets the run-level prelude; profile and peaks measure in a worker."""

from __future__ import annotations

import pytest

from deepgap.store import Store


def test_a_new_fleet_run_leaves_the_host_cpu_out_and_a_resumed_one_keeps_its_spec(
    tmp_path, monkeypatch, tiny_spec
):
    """The fleet's own rule (its lanes are GPUs), in `run_fleet`: `deepgap.api.run` only picks the launcher."""
    from deepgap import api
    from deepgap.fleet import launch as fleet_launch

    seen = []
    monkeypatch.setattr(fleet_launch, "run_sweep", lambda spec, *rest: seen.append(spec))
    store = str(tmp_path / "s.sqlite")
    api.run(tiny_spec.replace(cpu_baseline=True), store, devices=["fake-cpu:0", "fake-cpu:1"])
    assert seen[-1].cpu_baseline is False
    fleet_launch.run_fleet(tiny_spec.replace(cpu_baseline=True), store, fleet_launch.Fleet())
    assert seen[-1].cpu_baseline is False
    fleet_launch.run_fleet(tiny_spec.replace(cpu_baseline=True), store, fleet_launch.Fleet(), resume=True)
    assert seen[-1].cpu_baseline is True  # a resumed run is planned from its stored spec, not this one


@pytest.mark.slow
def test_a_fleet_run_gets_each_lanes_idle_baseline_and_thermal_warmup(tmp_path, tiny_spec):
    """Two real workers on fake-CPU lanes: each measures its own prelude, and results carry its facts."""
    from deepgap.drive.prelude import run_summaries
    from deepgap.fleet.launch import Fleet, run_fleet

    store = str(tmp_path / "s.sqlite")
    spec = tiny_spec.replace(
        options={"telemetry_backend": "fake:throttle"},
        idle_s=0.2,
        energy_window_s=0.05,
        sample_hz=50.0,
        thermal_warmup=True,
        thermal_window_s=0.3,
        thermal_timeout_s=5.0,
    )
    logged: list[str] = []
    res = run_fleet(spec, store, Fleet(devices=["fake-cpu:0", "fake-cpu:1"]), log=logged.append)
    s = Store(store, readonly=True)
    try:
        summ = run_summaries(s, res.run_id)
        df = s.results_frame([res.run_id])
    finally:
        s.close()
    assert [i["status"] for i in summ["idle"]] == ["ok", "ok"]  # one baseline per lane
    assert [t["status"] for t in summ["thermal"]] == ["ok", "ok"]
    for lane in ("fake-cpu:0", "fake-cpu:1"):
        assert any(m.startswith(f"{lane}: idle baseline") for m in logged), logged
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    for e in df["extra"]:  # the lane's idle power and steady clock reached its measurements
        assert e.telemetry.idle_power_w == pytest.approx(100.0, rel=0.05)
        assert e.telemetry.sm_clock_ref_mhz == 1100.0


def test_the_run_kind_is_passed_to_the_store_in_one_place(tmp_path):
    """`RunSession.open` stores its kind, so resume picks up runs of its own kind only."""
    from deepgap.drive.session import PROFILE, RunSession

    path = str(tmp_path / "s.sqlite")
    with RunSession(path, PROFILE) as session:
        run_id = session.open({"models": ["tinycnn"]}, "deepgap profile", {"host": "test"})
        session.finish("interrupted")
    s = Store(path, readonly=True)
    try:
        assert s.run(run_id)["kind"] == PROFILE and s.run(run_id)["status"] == "interrupted"
        assert s.latest_unfinished() is None  # an interrupted profile is no sweep to resume
    finally:
        s.close()
    from deepgap.core.errors import UsageError
    from deepgap.drive.session import open_resume

    with pytest.raises(UsageError, match="continues sweeps only"):
        open_resume(path, run_id)  # not even by its id


def test_an_interrupted_session_is_stored_interrupted(tmp_path):
    from deepgap.drive.session import RunSession

    path = str(tmp_path / "s.sqlite")
    with pytest.raises(KeyboardInterrupt), RunSession(path) as session:
        run_id = session.open({}, "deepgap run", {})
        raise KeyboardInterrupt
    s = Store(path, readonly=True)
    assert s.run(run_id)["status"] == "interrupted"
    s.close()


@pytest.mark.slow
def test_profile_and_peaks_measure_in_a_worker_process_not_the_cli(tmp_path, monkeypatch):
    """The parent's own measuring functions are broken here: the commands still work, so a worker measured."""
    import deepgap.core.envinfo
    import deepgap.roofline.peaks_measure
    import deepgap.roofline.profile_measure
    from deepgap.cli import main
    from deepgap.drive.prelude import run_summaries
    from deepgap.roofline import storage

    def parent_must_not(*a, **k):
        raise AssertionError("the CLI process measured or probed the device itself")

    monkeypatch.setattr(deepgap.roofline.peaks_measure, "measure_peaks", parent_must_not)
    monkeypatch.setattr(deepgap.roofline.profile_measure, "run_profile", parent_must_not)
    monkeypatch.setattr(deepgap.core.envinfo, "collect", parent_must_not)
    path = str(tmp_path / "s.sqlite")
    assert (
        main(
            [
                "peaks",
                "--device",
                "cpu",
                "--size",
                "64",
                "--bandwidth-mib",
                "4",
                "--repeats",
                "1",
                "--only",
                "fp32,memory",
                "--idle-time",
                "0.1",
                "--store",
                path,
            ]
        )
        == 0
    )
    monkeypatch.chdir(tmp_path)  # a relative --trace-dir is this directory's, whatever the worker's is
    assert (
        main(
            [
                "profile",
                "--model",
                "tinycnn",
                "--batch-size",
                "2",
                "--device",
                "cpu",
                "--warmup",
                "1",
                "--steps",
                "2",
                "--idle-time",
                "0.1",
                "--quiet",
                "--trace-dir",
                "traces",
                "--store",
                path,
            ]
        )
        == 0
    )
    assert [p.name for p in (tmp_path / "traces").iterdir()] == ["tinycnn-infer-fp32-bs2.trace.json"]
    s = Store(path, readonly=True)
    try:
        peaks = storage.peaks_frame(s).set_index("name")
        prof = storage.profiles_frame(s)
        runs = s.runs()
        idle = [run_summaries(s, r["run_id"])["idle"] for r in runs]
    finally:
        s.close()
    assert peaks.loc["fp32", "status"] == "ok" and peaks.loc["memory", "value"] > 0
    assert len(prof) == 1 and prof["status"].iloc[0] == "ok"
    assert [r["kind"] for r in runs] == ["peaks", "profile"]
    assert [len(i) for i in idle] == [1, 1]  # every kind of run gets the idle baseline


def test_the_worker_protocol_in_process_and_across_processes(tiny_spec):
    """Handlers by kind; a failing handler comes back as a status, never a dead pipe; an unknown kind is the
    caller's error, raised before anything is sent (the worker is untouched)."""
    from deepgap.core.records import Status
    from deepgap.drive.handle import WorkerFailed, WorkerHandle
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.plan import expand
    from deepgap.drive.runner import SweepRunner

    runner = SweepRunner(tiny_spec, "cpu", worker=InProcessWorker("cpu"))
    results = list(runner.run(expand(tiny_spec, "cpu")))
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert runner.environment()["device_name"]
    for worker in (InProcessWorker("cpu"), WorkerHandle("cpu")):
        worker.start()
        try:
            with pytest.raises(ValueError, match="unknown worker request 'no-such-kind'"):
                worker.call("no-such-kind", None, 60)
            with pytest.raises(WorkerFailed) as failed:
                worker.call("measure", None, 60)  # the handler raises on a payload that is no request
            assert failed.value.status == Status.ERROR and "AttributeError" in failed.value.reason
            assert worker.call("env", None, 60)["device_name"]  # the worker still answers after a failure
        finally:
            worker.stop()
