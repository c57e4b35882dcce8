"""Real worker processes: one bad configuration costs only itself."""

import os

import pytest
from repo_paths import TESTS

import deepgap
from deepgap.core.records import Status


def _run(tmp_path, spec):
    return deepgap.run(spec, store=str(tmp_path / "s.sqlite"))


def test_the_fork_server_preload_never_touches_cuda(monkeypatch):
    """Workers fork from a server that imported ``_PRELOAD``: that import must not initialise CUDA or count
    devices (a CUDA driver initialised before fork() fails in every child).

    Checked in this process's fork server itself, its preload led by `cuda_watch` (which wraps torch's CUDA
    entry points), by a worker forked from it; the file's other tests then fork their workers from the same
    server (so this test comes first). Until 2026-12-03 a fresh interpreter imported the preload once more
    for this check (~6.5 CPU-s).
    """
    from deepgap.drive import handle

    handle._stop_fork_server()  # a server an earlier test started was born without the watch
    monkeypatch.setenv("DEEPGAP_WORKER_PRELOAD", ",".join(["cuda_watch", *handle._PRELOAD[1:]]))
    # the server finds `cuda_watch` on its PYTHONPATH (Python 3.11's fork server ignores the sys.path it is given)
    here = str(TESTS)  # where cuda_watch.py is
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]))
    assert handle._preload() == [handle._PRELOAD[0], "cuda_watch", *handle._PRELOAD[1:]]
    w = handle.WorkerHandle("cpu")
    try:
        kind, (server, worker, calls, initialised) = w.spawn(_cuda_report, (), "cuda-watch", 300)
    finally:
        w.stop()
    assert kind == "ready" and server != worker  # the server imported the watch, then the whole preload
    assert (calls, initialised) == ([], False)


def _cuda_report(conn):
    import os

    import cuda_watch
    import torch

    conn.send(("ready", (cuda_watch.PID, os.getpid(), list(cuda_watch.CALLS), torch.cuda.is_initialized())))


@pytest.mark.slow
def test_crash_hang_error_oom_are_isolated(tmp_path, tiny_spec):
    spec = tiny_spec.replace(
        models=("fault:crash", "fault:hang", "fault:error", "fault:oom", "tinycnn"),
        batch_sizes=(2, 4, 8),
        timeout_s=4.0,  # the hang waits out its timeout; healthy ones need < 1 s
    )
    res = _run(tmp_path, spec)
    by = {(r.spec.model, r.spec.batch_size): r for r in res.results}
    assert len(by) == 15
    assert by[("fault:crash", 2)].status == Status.CRASH and "SIGSEGV" in by[("fault:crash", 2)].reason
    assert by[("fault:hang", 2)].status == Status.TIMEOUT
    assert by[("fault:hang", 4)].status == Status.SKIPPED and "hung" in by[("fault:hang", 4)].reason
    assert (
        by[("fault:error", 4)].status == Status.ERROR and "simulated failure" in by[("fault:error", 4)].reason
    )
    # fault:oom runs at batch 2, runs out of memory at 4, and 8 is skipped with the reason
    assert by[("fault:oom", 2)].status == Status.OK
    assert by[("fault:oom", 4)].status == Status.OOM
    assert by[("fault:oom", 8)].status == Status.SKIPPED and "batch 4" in by[("fault:oom", 8)].reason
    # the healthy model after all that is measured normally
    assert all(by[("tinycnn", b)].status == Status.OK for b in (2, 4, 8))
    df = res.to_pandas()
    assert len(df) == 15 and df["config_key"].is_unique


@pytest.mark.slow
def test_ok_result_is_complete(tmp_path, tiny_spec):
    res = _run(tmp_path, tiny_spec.replace(precisions=("fp32", "tf32")))
    ok = [r for r in res.results if r.status == Status.OK]
    skipped = [r for r in res.results if r.status == Status.SKIPPED]
    assert len(ok) == 2 and len(skipped) == 2 and "tf32" in skipped[0].reason  # stored, with the reason
    r = ok[1]
    assert r.latency.n == 6 and len(r.samples_s) == 2 and r.n_repeats == 2
    assert r.throughput_ips == pytest.approx(r.spec.batch_size / r.latency.median_s)
    assert r.throughput_pipelined_ips > 0 and r.flops_per_image > 0 and r.params > 0
    assert r.details.correctness.flagged is False and r.details.correctness.rel_l2 < 1e-5
    assert r.host_rss_bytes > 0
    df = res.to_pandas()
    assert df["weights_sha"].dropna().nunique() == 1  # identical weights across configurations


def test_a_worker_sees_the_parents_environment_of_the_moment(monkeypatch):
    """The fork server keeps the environment it started with; a worker gets the parent's as it is now."""
    from deepgap.drive.handle import WorkerHandle

    w = WorkerHandle("cpu")
    w.start()  # the fork server runs from here on (if no earlier test started it)
    w.stop()
    monkeypatch.setenv("DEEPGAP_TEST_MARK", "now")
    w.spawn(_report_environ, ("DEEPGAP_TEST_MARK",), "env-check", 120)
    try:
        assert w.recv(120) == ("environ", "now")
    finally:
        w.stop()


def _report_environ(conn, key):
    import os

    conn.send(("ready", None))
    conn.send(("environ", os.environ.get(key)))


def test_each_sweep_runs_in_a_fresh_worker_process():
    """Sweep passes are measured by different processes, so their spread is the spread between processes."""
    from deepgap.core.records import ConfigSpec, Result, Status
    from deepgap.drive.config import SweepSpec
    from deepgap.drive.runner import SweepRunner

    class FakeWorker:
        def __init__(self):
            self.pid, self.live, self.starts = 0, False, 0

        def alive(self):
            return self.live

        def start(self):
            self.starts += 1
            self.pid, self.live = self.starts, True

        def stop(self):
            self.live = False

        def call(self, kind, req, timeout):
            return Result(spec=req.spec, status=Status.OK, reason=f"pid {self.pid}")

    runner = SweepRunner(SweepSpec(models=("tinycnn",), device="cpu"), "cpu", worker=FakeWorker())
    cfgs = [
        ConfigSpec(model="tinycnn", engine="eager", precision="fp32", batch_size=b, device="cpu", sweep=s)
        for s in (0, 1)
        for b in (1, 2)
    ]
    pids = [r.reason for r in runner.run(cfgs)]
    assert pids == ["pid 1", "pid 1", "pid 2", "pid 2"]


def test_a_workers_progress_lines_reach_on_progress_before_its_answer():
    """A handler's progress lines (`deepgap.core.progress`) come through the pipe ahead of its answer."""
    from deepgap.drive.handle import WorkerHandle

    w = WorkerHandle("cpu")
    heard = []
    w.on_progress = heard.append
    try:
        assert w.spawn(_progress_then_answer, (3,), "progress", 120) == ("ready", None)
        assert w.recv(120) == ("ok", 42)
    finally:
        w.stop()
    assert heard == ["phase 0", "phase 1", "phase 2"]


def test_progress_lines_do_not_extend_the_wait_for_an_answer():
    """A worker that keeps saying progress but never answers is still lost at the timeout."""
    from deepgap.core.records import Status
    from deepgap.drive.handle import WorkerHandle, WorkerLost

    w = WorkerHandle("cpu")
    heard = []
    w.on_progress = heard.append
    try:
        assert w.spawn(_progress_then_answer, (None,), "progress-forever", 120) == ("ready", None)
        with pytest.raises(WorkerLost) as lost:
            w.recv(1.5)
    finally:
        w.stop()
    assert lost.value.status == Status.TIMEOUT and heard  # it did say something before it was killed


def _progress_then_answer(conn, n):
    import itertools
    import time

    from deepgap.core import progress

    conn.send(("ready", None))
    with progress.sink(lambda line: conn.send(("progress", line))):
        for i in itertools.count() if n is None else range(n):
            progress.say(f"phase {i}")
            if n is None:
                time.sleep(0.1)
    conn.send(("ok", 42))
