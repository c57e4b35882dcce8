"""A Ray sweep gets the run-level prelude: each device's idle baseline and thermal warm-up, in an actor.

Through the in-process Ray double (`fake_ray`: Ray is not installed everywhere) and real deepgap worker
processes on the CPU with the scripted telemetry backend (100 W idle, a steady clock of 1100 MHz).
"""

from __future__ import annotations

import pytest
from fake_ray import install

from deepgap.store import Store

TWO_NODES = [{"NodeID": "a" * 12, "Resources": {"CPU": 2.0}}, {"NodeID": "b" * 12, "Resources": {"CPU": 2.0}}]


@pytest.mark.slow
def test_a_ray_sweep_stores_one_prelude_per_device_and_tasks_apply_it(tmp_path, tiny_spec, monkeypatch):
    from deepgap.drive.prelude import run_summaries
    from deepgap.fleet.launch import Fleet, run_fleet

    ray = install(monkeypatch, TWO_NODES)
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
    res = run_fleet(spec, store, Fleet(ray="local"), log=logged.append)
    s = Store(store, readonly=True)
    try:
        run = s.run(res.run_id)
        summ = run_summaries(s, res.run_id)
        df = s.results_frame([res.run_id])
    finally:
        s.close()
    assert (run["kind"], run["status"]) == ("fleet", "finished") and run["env"]["fleet"]["backend"] == "ray"
    assert [i["status"] for i in summ["idle"]] == ["ok", "ok"]  # one per node (a CPU sweep: a device each)
    assert [t["status"] for t in summ["thermal"]] == ["ok", "ok"]
    for node in ("aaaaaa", "bbbbbb"):
        assert any(f"({node}) CPU: idle baseline" in m for m in logged), logged
    assert len(ray.actors) == 2 and {a.where[0] for a in ray.actors} == {"a" * 12, "b" * 12}
    assert not any(a.alive for a in ray.actors)  # stopped before the configurations ran
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    for e in df["extra"]:  # the device's idle power and steady clock reached the task that measured on it
        assert e.telemetry.idle_power_w == pytest.approx(100.0, rel=0.05)
        assert e.telemetry.sm_clock_ref_mhz == 1100.0


def test_every_gpu_of_a_matching_node_gets_a_prelude_slot():
    from deepgap.fleet.ray_prelude import device_key, slots

    nodes = [
        {"NodeID": "n1", "Resources": {"GPU": 2.0, "CPU": 8.0}},
        {"NodeID": "n2", "Resources": {"CPU": 4.0}},
        {"NodeID": "n3", "Resources": {"GPU": 1.0}},
    ]
    assert slots(nodes, "cuda") == ["n1", "n1", "n3"]
    assert slots(nodes, "cpu") == ["n1", "n2", "n3"]
    assert device_key("n1", "cuda", ["1"]) == "n1/1" and device_key("n1", "cpu", []) == "n1/cpu"


def test_a_lost_actor_is_a_stored_status_not_a_failed_run(monkeypatch, tiny_spec):
    """The driver's side of an actor turns a lost actor into the summary's status, as a lost worker."""
    from deepgap.core.records import ConfigSpec, Status
    from deepgap.fleet.ray_prelude import ActorRunner

    ray = install(monkeypatch, TWO_NODES)

    class Lost:
        class idle_baseline:  # noqa: N801 - the shape of an actor method
            @staticmethod
            def remote(*a):
                from fake_ray import Ref

                return Ref(error=RuntimeError("ActorDiedError: node died"))

        thermal_warmup = idle_baseline

    runner = ActorRunner(ray, Lost(), tiny_spec)
    idle = runner.idle_baseline(runner.telemetry_settings())
    assert idle["summary"]["status"].startswith("unavailable: the Ray actor was lost (RuntimeError")
    cfg = ConfigSpec("tinycnn", "eager", "fp32", 1, "cpu")
    assert runner.thermal_warmup(cfg, 1.0).status == Status.CRASH


@pytest.mark.slow
def test_a_ray_sweep_whose_prelude_measures_nothing_starts_no_actor(tmp_path, tiny_spec, monkeypatch):
    from deepgap.fleet.launch import Fleet, run_fleet

    ray = install(monkeypatch, TWO_NODES)
    res = run_fleet(
        tiny_spec.replace(idle_s=0.0, thermal_warmup=False), str(tmp_path / "s.sqlite"), Fleet(ray="local")
    )
    assert ray.actors == [] and len(res.results) == 2
    # the local cluster's workers measure at normal priority (Ray's default nice 15 starves them on a busy host)
    assert ray.init_kw["_system_config"] == {"worker_niceness": 0}
