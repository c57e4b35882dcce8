"""The one driver (`deepgap.drive.loop.drive`): every kind of run goes through it, a body that raises
leaves the run ``interrupted``, ``--resume`` continues, and no command drives a run itself.

No worker processes: the sweeps use runners that pretend to measure, profile and peaks the real handlers in
this process (`InProcessWorker`), serve a serving worker that cannot start (its failed set-up is the run).
"""

from __future__ import annotations

import ast

import pytest
import repo_paths

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.drive import loop
from deepgap.drive.config import SweepSpec
from deepgap.drive.inprocess import InProcessWorker
from deepgap.drive.launcher import Finished, Started
from deepgap.drive.loop import Job, Plan, drive, record_result
from deepgap.drive.prelude import PreludeSettings
from deepgap.drive.runner import SweepRunner
from deepgap.drive.session import RunSession
from deepgap.store import Store

SRC = repo_paths.SRC / "deepgap"
GRID = dict(
    models=("tinycnn",), batch_sizes=(1, 2, 4), device="cpu", telemetry=False, iterations=1, repeats=1
)


class FakeRunner(SweepRunner):
    """A one-device launcher that pretends to measure (no worker process)."""

    measured: list[str] = []
    stop_after: int | None = None  # raise KeyboardInterrupt when this many were measured

    def start(self):
        return None

    def environment(self):
        return {"host": "fake-host", "device": self.device, "device_name": "Fake device"}

    def _one(self, cfg):
        if self.stop_after is not None and len(FakeRunner.measured) >= self.stop_after:
            raise KeyboardInterrupt
        FakeRunner.measured.append(cfg.key)
        return Result(spec=cfg, status=Status.OK, duration_s=0.01)

    def close(self, wait=True):
        return None


@pytest.fixture
def kinds(monkeypatch):
    """The kind of every run session that `drive` opened (patched where only `drive` looks it up)."""
    seen: list[str] = []

    class Spy(RunSession):
        def __init__(self, path, kind, store=None):
            super().__init__(path, kind, store)
            seen.append(kind)

    monkeypatch.setattr(loop, "RunSession", Spy)
    FakeRunner.measured, FakeRunner.stop_after = [], None
    return seen


def _runs(path):
    s = Store(path, readonly=True)
    try:
        return s.runs(), s.results_frame()
    finally:
        s.close()


def _in_process(spec, device):
    return SweepRunner(spec, device, worker=InProcessWorker(device))


def test_a_sweep_goes_through_drive(kinds, monkeypatch, tmp_path):
    from deepgap import api
    from deepgap.drive import sweep

    monkeypatch.setattr(sweep, "SweepRunner", FakeRunner)
    events = []
    res = api.run(SweepSpec(**GRID), store=str(tmp_path / "s.sqlite"), on_event=events.append)
    runs, df = _runs(res.store_path)
    assert kinds == ["sweep"] and [r["kind"] for r in runs] == ["sweep"] and runs[0]["status"] == "finished"
    assert len(df) == 3 and len(res.results) == 3
    assert [(e.index, e.total, e.result is None) for e in events][:2] == [(0, 3, True), (0, 3, False)]


def test_a_fleet_goes_through_drive(kinds, tmp_path):
    from deepgap.fleet.common import FleetEvent
    from deepgap.fleet.devices import fake_lanes
    from deepgap.fleet.launch import Fleet, run_fleet

    events = []
    res = run_fleet(
        SweepSpec(**GRID),
        str(tmp_path / "s.sqlite"),
        Fleet(devices=fake_lanes(2), backend_options={"runner_factory": FakeRunner}),
        on_event=events.append,
    )
    runs, df = _runs(res.store_path)
    assert kinds == ["fleet"] and runs[0]["kind"] == "fleet" and runs[0]["status"] == "finished"
    assert runs[0]["env"]["fleet"]["devices"] == ["fake-cpu:0", "fake-cpu:1"] and len(df) == 3
    assert all(isinstance(e, FleetEvent) and e.lane for e in events)


def test_profile_goes_through_drive(kinds, monkeypatch, tmp_path):
    from deepgap import api
    from deepgap.roofline import profile_run, storage

    monkeypatch.setattr(profile_run, "SweepRunner", _in_process)
    seen = []
    run = api.profile(
        "tinycnn",
        batch_sizes="2",
        device="cpu",
        warmup=1,
        steps=2,
        store=str(tmp_path / "s.sqlite"),
        prelude=PreludeSettings(idle_s=0.0),
        on_result=seen.append,
    )
    assert kinds == ["profile"] and [r.status for r in run.results] == ["ok"] and seen == run.results
    s = Store(run.store_path, readonly=True)
    try:
        assert s.run(run.run_id)["kind"] == "profile" and len(storage.profiles_frame(s)) == 1
    finally:
        s.close()


def test_peaks_go_through_drive_and_store_nothing_without_a_store(kinds, monkeypatch, tmp_path):
    from deepgap import api
    from deepgap.roofline import peaks_run, storage

    monkeypatch.setattr(peaks_run, "SweepRunner", _in_process)
    kw = dict(size=64, bandwidth_mib=4, only="fp32,memory", repeats=1, prelude=PreludeSettings(idle_s=0.0))
    run = api.peaks("cpu", store=str(tmp_path / "s.sqlite"), **kw)
    assert kinds == ["peaks"] and [p.name for p in run.peaks] == ["fp32", "memory"] and run.run_id
    s = Store(run.store_path, readonly=True)
    try:
        assert s.run(run.run_id)["kind"] == "peaks" and len(storage.peaks_frame(s)) == 2
    finally:
        s.close()
    bare = api.peaks("cpu", store=None, **kw)
    assert bare.run_id is None and len(bare.peaks) == 2 and kinds == ["peaks", "peaks"]


def test_serve_goes_through_drive_and_stores_a_worker_that_never_started(kinds, monkeypatch, tmp_path):
    """The serving worker is the launcher; one that cannot start is the run's failed set-up, as before."""
    from deepgap.serving.records.storage import levels_frame
    from deepgap.serving.run import serve_run
    from deepgap.serving.run.process import ServingWorker, SetupFailed
    from deepgap.serving.run.spec import ServeSpec

    class Unstartable(ServingWorker):
        def start(self):
            self.failure = SetupFailed(Status.ERROR, "no device here (test)")

    monkeypatch.setattr(serve_run, "ServingWorker", Unstartable)
    path = str(tmp_path / "s.sqlite")
    spec = ServeSpec(model="tinycnn", device="cpu", scenario="single-stream", threads=1, batch_sizes=(1,))
    out = serve_run.run_serve(spec, path, say=lambda m: None, command="deepgap serve (test)")
    assert kinds == ["serve"] and (out.status, out.reason) == ("error", "no device here (test)")
    s = Store(path, readonly=True)
    try:
        run = s.run(out.run_id)
        levels = levels_frame(s, [out.run_id])
    finally:
        s.close()
    assert (run["kind"], run["status"], run["env"]) == ("serve", "finished", {"device": "cpu"})
    assert list(levels["status"]) == ["error"] and list(levels["purpose"]) == ["setup"]


class _Launcher:
    """The smallest `Launcher`: no workers, a fingerprint, no devices for the prelude."""

    def __init__(self, env=None):
        self.env, self.closed = env, False

    def start(self):
        return None

    def environment(self):
        return self.env

    def prelude(self, measure, configs):
        return None

    def restart(self):
        return None

    def close(self):
        self.closed = True


def _cfg(b: int) -> ConfigSpec:
    return ConfigSpec("tinycnn", "eager", "fp32", b, "cpu")


def test_a_body_that_raises_leaves_the_run_interrupted_and_closes_the_launcher(tmp_path):
    path = str(tmp_path / "s.sqlite")
    launcher = _Launcher({"host": "h"})

    def steps(_launcher):
        yield Started("", _cfg(1))
        yield Finished("", Result(spec=_cfg(1), status=Status.OK))
        raise RuntimeError("the body failed")

    job = Job(
        kind="sweep",
        store=path,
        command="test",
        plan=lambda resumed: Plan(launcher, SweepSpec(**GRID), SweepSpec(**GRID), steps, total=2),
        record=record_result,
    )
    with pytest.raises(RuntimeError, match="the body failed"):
        drive(job)
    runs, df = _runs(path)
    assert [r["status"] for r in runs] == ["interrupted"] and len(df) == 1  # what finished is kept
    assert launcher.closed


def test_a_stop_just_after_the_run_row_is_made_marks_it_interrupted(monkeypatch, tmp_path):
    """Ctrl-C between creating the run row and entering the session left the run ``running`` for good
    (session 33): the session is now entered before the row is made."""
    path = str(tmp_path / "s.sqlite")
    real_open = RunSession.open

    def open_then_stop(self, *args, **kwargs):
        real_open(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(RunSession, "open", open_then_stop)
    job = Job(
        kind="sweep",
        store=path,
        command="test",
        plan=lambda resumed: Plan(
            _Launcher({"host": "h"}), SweepSpec(**GRID), SweepSpec(**GRID), lambda _: iter(())
        ),
        record=record_result,
    )
    with pytest.raises(KeyboardInterrupt) as exc:
        drive(job)
    runs, _ = _runs(path)
    assert [r["status"] for r in runs] == ["interrupted"]
    assert exc.value.nothing_stored is False and exc.value.resumable is True  # the CLI's line offers --resume


def test_a_launcher_without_a_fingerprint_opens_the_run_with_the_first_result(tmp_path):
    path = str(tmp_path / "s.sqlite")

    def steps(_launcher):
        yield Finished("", Result(spec=_cfg(1), status=Status.OK), {"host": "node"})

    plan = Plan(
        _Launcher(None),
        SweepSpec(**GRID),
        SweepSpec(**GRID),
        steps,
        total=1,
        env_of=lambda item: item.node_env,
    )
    done = drive(Job(kind="sweep", store=path, command="test", plan=lambda r: plan, record=record_result))
    runs, _ = _runs(path)
    assert done.run_id == runs[0]["run_id"] and runs[0]["env"] == {"host": "node"} == done.env


def test_resume_continues_the_interrupted_run_with_what_is_left(kinds, monkeypatch, tmp_path):
    from deepgap import api
    from deepgap.drive import sweep

    monkeypatch.setattr(sweep, "SweepRunner", FakeRunner)
    path = str(tmp_path / "s.sqlite")
    FakeRunner.stop_after = 2
    with pytest.raises(KeyboardInterrupt):
        api.run(SweepSpec(**GRID), store=path)
    runs, df = _runs(path)
    assert [r["status"] for r in runs] == ["interrupted"] and len(df) == 2
    FakeRunner.stop_after = None
    res = api.run(store=path, resume=True)
    runs, df = _runs(path)
    assert res.run_id == runs[0]["run_id"] and [r["status"] for r in runs] == ["finished"]
    assert len(res.results) == 1 and len(df) == 3 and len(set(FakeRunner.measured)) == 3  # none twice
    assert kinds == ["sweep", "sweep"]


def test_no_command_drives_a_run_itself():
    """``commands/`` parses and wires: no run session, launcher, worker or driver loop of its own."""
    driving = {
        "RunSession",
        "SweepRunner",
        "WorkerHandle",
        "InProcessWorker",
        "ServingWorker",
        "LocalScheduler",
        "RayBackend",
        "drive",
        "Job",
        "Plan",
        "open_resume",
    }
    found = []
    for path in sorted((SRC / "commands").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("deepgap"):
                found += [f"{path.name}: imports {a.name}" for a in node.names if a.name in driving]
            if isinstance(node, ast.Attribute) and node.attr in ("worker", "RunSession", "SweepRunner"):
                found.append(f"{path.name}:{node.lineno} uses .{node.attr}")
            if isinstance(node, ast.Name) and node.id in driving:
                found.append(f"{path.name}:{node.lineno} uses {node.id}")
    assert not found, "commands/ must only parse, call the API and print:\n" + "\n".join(found)
