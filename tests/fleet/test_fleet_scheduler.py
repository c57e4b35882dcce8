"""The multi-device scheduler: fake GPUs (no processes) for the policy, fake-CPU lanes for real workers."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

import deepgap
from deepgap.core.errors import UsageError
from deepgap.core.records import Result, Status
from deepgap.drive.runner import SweepRunner
from deepgap.fleet.devices import Lane, fake_lanes, logical_device, parse_devices
from deepgap.fleet.launch import Fleet, run_fleet
from deepgap.store import Store


def lanes(n: int) -> list[Lane]:
    return [Lane(f"cuda:{i}", f"cuda:{i}") for i in range(n)]


class Ledger:
    """What the fake devices did: every measurement, and the most ever running at once per device."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, int] = defaultdict(int)
        self.max_active: dict[str, int] = defaultdict(int)
        self.overall = 0
        self.max_overall = 0
        self.measured: list[tuple[str, str]] = []  # (device, config key)


def fake_factory(
    ledger: Ledger, oom_at: int | None = None, dead: set[str] = frozenset(), dead_after: int = 1
):
    """Runners whose `_one` pretends to measure (SweepRunner.run's real cascade logic is kept)."""

    class FakeRunner(SweepRunner):
        def start(self):
            return None

        def environment(self):
            return {"host": "fake-host", "device": self.device, "device_name": f"Fake GPU {self.device[-1]}"}

        def _one(self, cfg):
            self.count = getattr(self, "count", 0) + 1
            if self.device in dead and self.count > dead_after:  # one runner per lane
                raise UsageError(f"the worker could not use device {self.device}: fell off the bus")
            with ledger.lock:
                ledger.active[self.device] += 1
                ledger.overall += 1
                ledger.max_active[self.device] = max(
                    ledger.max_active[self.device], ledger.active[self.device]
                )
                ledger.max_overall = max(ledger.max_overall, ledger.overall)
            time.sleep(0.03)
            with ledger.lock:
                ledger.active[self.device] -= 1
                ledger.overall -= 1
                ledger.measured.append((self.device, cfg.key))
            if oom_at is not None and cfg.model == "resnet50" and cfg.batch_size >= oom_at:
                return Result(spec=cfg, status=Status.OOM, reason="CUDA out of memory (fake)")
            return Result(spec=cfg, status=Status.OK, duration_s=0.03)

        def close(self):
            return None

    return FakeRunner


GRID = dict(
    models=("resnet18", "resnet50"),
    precisions=("fp32", "fp16"),
    batch_sizes=(1, 2, 4, 8),
    sweeps=2,
    device="auto",
    iterations=1,
    repeats=1,
    warmup=0,
)


def test_parse_devices():
    assert [lane.name for lane in parse_devices("all", count=lambda: 3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert parse_devices("cuda:1, cuda", count=lambda: 2) == [
        Lane("cuda:1", "cuda:1"),
        Lane("cuda:0", "cuda:0"),
    ]
    assert parse_devices("fake-cpu:0,fake-cpu:1") == fake_lanes(2)
    for text, match in [
        ("cuda:0,cuda:0", "more than once"),
        ("cuda:0,cuda", "more than once"),
        ("cuda:2", "1 GPU"),
        ("tpu:0", "unknown device"),
        ("cpu", "one device"),
        ("cuda:0,fake-cpu:1", "mixes"),
        ("", "empty"),
    ]:
        with pytest.raises(UsageError, match=match):
            parse_devices(text, count=lambda: 1)
    with pytest.raises(UsageError, match="no CUDA GPU"):
        parse_devices("all", count=lambda: 0)


def test_logical_device_keeps_store_keys_independent_of_the_gpu():
    assert logical_device(lanes(2), "auto") == "cuda"
    assert logical_device(fake_lanes(2), "auto") == "cpu"
    assert logical_device(lanes(2), "cuda:1", resumed=True) == "cuda:1"
    with pytest.raises(UsageError, match="does not fit"):
        logical_device(lanes(2), "cuda:1")
    with pytest.raises(UsageError, match="does not fit"):
        logical_device(lanes(2), "cpu")


def test_ladders_spread_over_devices_one_configuration_per_device(tmp_path):
    ledger = Ledger()
    store = str(tmp_path / "s.sqlite")
    events = []
    res = run_fleet(
        GRID,
        store,
        Fleet(devices=lanes(3), backend_options={"runner_factory": fake_factory(ledger, oom_at=4)}),
        on_event=events.append,
    )
    df = res.to_pandas()
    assert len(df) == 32 and df["config_key"].is_unique  # 2 models × 2 precisions × 4 batches × 2 sweeps
    assert set(df["device"]) == {"cuda"}  # the key does not depend on the GPU that measured it
    assert max(ledger.max_active.values()) == 1  # never two configurations on one device at once
    assert ledger.max_overall >= 2 and len({d for d, _ in ledger.measured}) == 3  # devices worked in parallel
    for _, ladder in df.groupby(["model", "precision", "sweep"]):  # a batch ladder stays on one device
        assert ladder["extra"].map(lambda e: e.lane).nunique() == 1
    r50 = df[df["model"] == "resnet50"].set_index(["precision", "sweep", "batch_size"])
    assert (r50.xs(4, level="batch_size")["status"] == "oom").all()  # the OOM cascade still works
    skipped = r50.xs(8, level="batch_size")
    assert (skipped["status"] == "skipped").all() and skipped["reason"].str.contains("batch 4").all()
    assert len(ledger.measured) == 32 - 4  # skipped ones never reached a device
    # every row carries its device's fingerprint, and results_frame reads it
    assert set(df["device_name"]) == {"Fake GPU 0", "Fake GPU 1", "Fake GPU 2"}
    run = Store(store, readonly=True).runs()[0]
    assert run["status"] == "finished" and run["env"]["fleet"] == {
        "backend": "devices",
        "devices": ["cuda:0", "cuda:1", "cuda:2"],
    }
    assert "mixed" in run["env"]["device_name"]
    done = [e for e in events if e.result is not None]
    assert len(done) == 32 and {e.lane for e in done} == {"cuda:0", "cuda:1", "cuda:2"}


def test_a_dead_device_hands_its_work_to_the_others(tmp_path):
    ledger = Ledger()
    res = run_fleet(
        GRID,
        str(tmp_path / "s.sqlite"),
        Fleet(
            devices=lanes(3),
            backend_options={"runner_factory": fake_factory(ledger, dead={"cuda:1"}, dead_after=2)},
        ),
    )
    df = res.to_pandas()
    assert len(df) == 32 and df["config_key"].is_unique and (df["status"] == "ok").all()
    assert sum(1 for d, _ in ledger.measured if d == "cuda:1") == 2


def test_all_devices_dead_interrupts_and_resume_finishes(tmp_path):
    store = str(tmp_path / "s.sqlite")
    ledger = Ledger()
    with pytest.raises(UsageError, match="not measured"):
        run_fleet(
            GRID,
            store,
            Fleet(
                devices=lanes(2),
                backend_options={
                    "runner_factory": fake_factory(ledger, dead={"cuda:0", "cuda:1"}, dead_after=3)
                },
            ),
        )
    s = Store(store, readonly=True)
    assert s.runs()[0]["status"] == "interrupted" and len(s.results_frame()) == 6
    s.close()
    res = run_fleet(
        None,
        store,
        Fleet(devices=lanes(2), backend_options={"runner_factory": fake_factory(Ledger())}),
        resume=True,
    )
    df = res.to_pandas()
    assert len(df) == 32 and df["config_key"].is_unique and len(res.results) == 26


def test_fleet_flags_are_checked_before_anything_is_written(tmp_path):
    store = str(tmp_path / "s.sqlite")
    with pytest.raises(UsageError, match="--where filters"):
        deepgap.run(GRID, store=store, where={"gpu": "L4"})
    with pytest.raises(UsageError, match="both given"):
        deepgap.run(GRID, store=store, devices="all", ray="auto")
    with pytest.raises(UsageError):
        deepgap.run(
            {**GRID, "device": "cpu"},
            store=store,
            devices=lanes(2),
        )
    import os

    assert not os.path.exists(store)


@pytest.mark.slow
def test_real_workers_on_fake_cpu_devices_then_resume_from_stored_settings(tmp_path, tiny_spec):
    """Two real worker processes; an interrupted fleet run resumes with its stored devices."""
    store = str(tmp_path / "s.sqlite")
    spec = tiny_spec.replace(sweeps=2)
    with pytest.raises(UsageError):  # both lanes die after one configuration each: 2 of 4 stored
        run_fleet(
            spec,
            store,
            Fleet(
                devices=["fake-cpu:0", "fake-cpu:1"],
                backend_options={"runner_factory": fake_factory(Ledger(), dead={"cpu"}, dead_after=1)},
            ),
        )
    assert len(Store(store, readonly=True).results_frame()) == 2
    res = deepgap.run(store=store, resume=True)  # no --devices: the run's stored fleet settings
    df = res.to_pandas()
    assert len(df) == 4 and df["config_key"].is_unique and (df["status"] == "ok").all()
    real = df[[e.correctness is not None for e in df["extra"]]]
    assert len(real) == 2 and set(real["extra"].map(lambda e: e.lane)) == {"fake-cpu:0", "fake-cpu:1"}
    assert (real["n_samples"] == 6).all()
