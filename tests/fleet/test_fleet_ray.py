"""A real Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`) runs tiny sweeps.

Tests run in file order and share one cluster (start-up costs ~10 s on two cores); the last test
removes a node. Each configuration is a Ray task that spawns a real deepgap worker.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

# Checked, not imported: importing ray costs ~2.5 CPU-s, which every xdist worker paid at collection although
# one of them runs this file. Each test that needs the module imports it (`_ray`).
if importlib.util.find_spec("ray") is None:
    pytest.skip("could not import 'ray': No module named 'ray'", allow_module_level=True)

import deepgap  # noqa: E402
from deepgap.cli import main  # noqa: E402
from deepgap.core.errors import UsageError  # noqa: E402
from deepgap.fleet.ray_placement import parse_where  # noqa: E402
from deepgap.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

# No run-level prelude here (idle_s 0): its actors, one deepgap worker each, cost about a minute on the
# loaded 2-core CI machine; tests/fleet/test_fleet_ray_prelude.py checks the prelude through a Ray double.
SPEC = dict(
    models=["tinycnn"],
    batch_sizes=[1, 2],
    device="cpu",
    warmup=1,
    iterations=3,
    repeats=2,
    threads=[1],
    max_time_s=5.0,
    timeout_s=120.0,
    idle_s=0.0,
)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
    # Ray starts its workers at nice 15 (`worker_niceness`), and the deepgap worker that a task spawns
    # inherits it: beside two busy loops such a worker got a few percent of a core and the sweep stalled for
    # minutes. Here the workers run at the test's own priority, so a loaded host slows them, never starves them.
    head = {"num_cpus": 0, "include_dashboard": False, "_system_config": {"worker_niceness": 0}}
    # Every Ray job starts fresh Ray workers, and each starts a fork server (four here): a tinycnn worker
    # never imports torchvision (a third of the server's start). The nodes' processes, Ray's workers among
    # them, inherit the environment of the moment.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPGAP_WORKER_PRELOAD", "torch,torch._dynamo,scipy.stats")
        c = Cluster(initialize_head=True, head_node_args=head)
        nodes = {
            "l4": c.add_node(num_cpus=1, resources={"accelerator_type:L4": 1}),
            "plain": c.add_node(num_cpus=1),
        }
    c.wait_for_nodes()
    c.nodes_by_name = nodes
    yield c
    if ray.is_initialized():
        ray.shutdown()
    for node in [*c.worker_nodes, c.head_node]:  # at once: a graceful stop waits up to 1 s per process
        c.remove_node(node, allow_graceful=False)
    c.shutdown()


def _ray():
    import ray

    return ray


def test_parse_where():
    assert parse_where(["gpu=L4", "node=10.0.0.5"]) == {"gpu": "L4", "node": "10.0.0.5"}
    for bad in (["gpu"], ["=L4"], ["gpu=L4", "GPU=T4"]):
        with pytest.raises(UsageError):
            parse_where(bad)


def _count(store: str) -> int:
    try:
        con = sqlite3.connect(store, timeout=5)
        try:
            return con.execute("SELECT count(*) FROM results").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def test_where_placement_survives_a_killed_driver_and_resume(cluster, tmp_path, capsys):
    """--where puts every configuration on the matching node; a driver killed between the two configurations
    leaves a resumable run, and --resume (its stored --ray address and --where) measures each one once.

    One test for both (they were two): each Ray job starts a Ray worker and a deepgap worker on its node
    (a cold start of torch, 20 s or more on the loaded 2-core CI machine), so the killed driver's job and
    the resume's job carry the placement checks too.
    """
    store = str(tmp_path / "s.sqlite")
    with pytest.raises(UsageError, match="GPU types: L4"):
        deepgap.run(SPEC, store=store, ray=cluster.address, where={"gpu": "T4"})
    with pytest.raises(UsageError, match="needs --threads"):
        deepgap.run({**SPEC, "threads": []}, store=store, ray=cluster.address)
    assert not os.path.exists(store)  # bad input wrote nothing
    assert not _ray().is_initialized()  # and disconnected what it connected
    argv = [
        sys.executable,
        "-m",
        "deepgap",
        "run",
        "--ray",
        cluster.address,
        "--where",
        "gpu=NVIDIA L4",
        "--models",
        "tinycnn",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-sizes",
        "1,2",
        "--warmup",
        "1",
        "--iterations",
        "3",
        "--repeats",
        "2",
        "--target-ci",
        "off",
        "--idle-time",
        "0",
        "--store",
        store,
        "--quiet",
    ]
    for attempt in range(3):  # catching the sweep between its two configurations is timing: a loaded
        # CI machine may miss the moment; a miss is retried on a fresh store (the behaviour is checked after)
        if attempt and os.path.exists(store):
            os.remove(store)
        proc = subprocess.Popen(argv, start_new_session=True)
        deadline = time.time() + 900  # poll for the state, generously: under two busy loops and other CI work
        # the driver's first result took more than 150 s (Ray worker, then a deepgap worker importing torch)
        while time.time() < deadline and proc.poll() is None and _count(store) < 1:
            time.sleep(0.1)
        killed_at = _count(store)
        if proc.poll() is None and killed_at == 1:
            break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for suffix in ("-wal", "-shm", "-lock"):
            if os.path.exists(store + suffix):
                os.remove(store + suffix)
    assert proc.poll() is None and killed_at == 1, f"could not catch the sweep mid-run ({killed_at} stored)"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver dies with no chance to clean up
    proc.wait(10)
    assert Store(store, readonly=True).runs()[0]["status"] == "running"
    # only the killed driver needs its own process; the resume runs in this one, through the CLI's main()
    assert main(["run", "--resume", "--store", store, "--quiet"]) == 0, capsys.readouterr().err
    assert not _ray().is_initialized()  # the driver disconnects what it connected
    s = Store(store, readonly=True)
    df = s.results_frame()
    assert len(s.runs()) == 1 and s.runs()[0]["status"] == "finished"
    assert len(df) == 2 and df["config_key"].is_unique and (df["status"] == "ok").all()
    for rid in df["result_id"]:
        assert [len(a) for a in s.samples(int(rid))] == [3, 3]
    l4 = cluster.nodes_by_name["l4"].node_id
    for e in df["extra"]:
        assert e.node_id == l4 and e.attempts == 1 and e.lost is None
        assert e.node_env["ray_node_id"] == l4 and e.node_env["torch"]  # the node's own fingerprint
        assert e.correctness.flagged is False
    assert (df["device_name"] == df["extra"].iloc[0].node_env["device_name"]).all()
    fleet = s.runs()[0]["env"]["fleet"]
    assert fleet["backend"] == "ray" and fleet["where"] == {"gpu": "NVIDIA L4"}
    assert [n["node_id"] for n in fleet["nodes"]] == [l4]


def test_a_lost_node_is_retried_elsewhere_and_recorded(cluster, tmp_path):
    """Removes a node that is running a configuration; the sweep completes, each configuration once."""
    removed: list[str] = []
    nodes = {n.node_id: n for n in cluster.nodes_by_name.values()}

    def on_event(ev):
        # the node that just finished picks up queued work at once; remove it while that runs
        if ev.result is not None and not removed:
            node_id = ev.result.details.node_id
            removed.append(node_id)
            threading.Timer(0.3, cluster.remove_node, args=(nodes[node_id],)).start()

    res = deepgap.run(
        {**SPEC, "sweeps": 2}, store=str(tmp_path / "s.sqlite"), ray=cluster.address, on_event=on_event
    )
    df = res.to_pandas()
    assert len(df) == 4 and df["config_key"].is_unique and (df["status"] == "ok").all()
    retried = [e for e in df["extra"] if e.attempts > 1]
    assert retried, "no configuration was running on the removed node"
    for e in retried:
        assert e.node_id != removed[0] and len(e.lost) == e.attempts - 1
        assert "NodeDied" in e.lost[0] or "WorkerCrashed" in e.lost[0]
