"""Issue 34's fleet parts without a GPU: --every-card on fake GPUs, the per-lane progress with a sweep ETA."""

from __future__ import annotations

import os

import pytest
from clirun import deepgap_cli
from test_fleet_scheduler import Ledger, fake_factory, lanes

from deepgap.core.errors import UsageError
from deepgap.core.events import Event
from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.fleet.launch import Fleet, run_fleet
from deepgap.fleet.progress import FleetProgress, duration_text, sweep_eta_s
from deepgap.store import Store

GRID = dict(
    models=("resnet18",),
    precisions=("fp16",),
    batch_sizes=(1, 2),
    sweeps=2,
    device="auto",
    iterations=1,
    repeats=1,
    warmup=0,
)


def carded(ledger, **kw):
    """Fake runners whose fingerprint names a card per device, as NVML's UUID does."""
    base = fake_factory(ledger, **kw)

    class Carded(base):
        def environment(self):
            return {**super().environment(), "gpu_uuid": f"GPU-fake-{self.device[-1]}"}

    return Carded


def test_every_card_measures_each_configuration_on_every_card(tmp_path):
    store = str(tmp_path / "s.sqlite")
    ledger = Ledger()
    res = run_fleet(
        GRID,
        store,
        Fleet(devices=lanes(3), every_card=True, backend_options={"runner_factory": carded(ledger)}),
    )
    df = res.to_pandas()
    assert len(df) == 2 * 2 * 3 and df["config_key"].is_unique  # 2 batches × 2 sweeps × 3 cards
    lane_of = df["extra"].map(lambda e: e.lane)
    assert (lane_of == df["sweep"].map(lambda s: f"cuda:{s // 2}")).all()  # card i measures sweeps 2i, 2i+1
    assert max(ledger.max_active.values()) == 1
    s = Store(store, readonly=True)
    frame = s.results_frame()
    assert sorted(set(frame["card"])) == ["GPU-fake-0", "GPU-fake-1", "GPU-fake-2"]
    assert s.runs()[0]["env"]["fleet"]["every_card"] is True
    s.close()


def test_every_card_leaves_a_dead_cards_work_for_resume(tmp_path):
    store = str(tmp_path / "s.sqlite")
    ledger = Ledger()
    with pytest.raises(UsageError, match="not measured"):
        run_fleet(
            GRID,
            store,
            Fleet(
                devices=lanes(2),
                every_card=True,
                backend_options={"runner_factory": carded(ledger, dead={"cuda:1"}, dead_after=1)},
            ),
        )
    assert sum(1 for d, _ in ledger.measured if d == "cuda:1") == 1  # never moved to cuda:0
    assert sum(1 for d, _ in ledger.measured if d == "cuda:0") == 4
    with pytest.raises(UsageError, match="same --devices"):  # each card has its own sweeps: not another set
        run_fleet(
            None,
            store,
            Fleet(devices=lanes(3), backend_options={"runner_factory": carded(Ledger())}),
            resume=True,
        )
    res = run_fleet(
        None,
        store,
        Fleet(devices=lanes(2), backend_options={"runner_factory": carded(Ledger())}),
        resume=True,
    )
    df = Store(store, readonly=True).results_frame()
    assert len(res.results) == 3 and len(df) == 8 and df["config_key"].is_unique  # the stored every_card kept


def test_every_card_flag_needs_devices(tmp_path):
    store = str(tmp_path / "s.sqlite")
    r = deepgap_cli("run", "--models", "resnet18", "--every-card", "--store", store)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--every-card" in r.stderr
    with pytest.raises(UsageError, match="--devices, not --ray"):
        run_fleet(GRID, store, Fleet(ray="auto", every_card=True))
    assert not os.path.exists(store)


def test_progress_one_line_per_lane_and_an_eta_for_the_whole_sweep():
    assert sweep_eta_s(0, 10, 5.0) is None and sweep_eta_s(4, 10, 60.0) == 90.0
    assert [duration_text(s) for s in (None, 12, 250, 3725)] == ["?", "12s", "4m10s", "1h02m"]
    from rich.console import Console

    from deepgap.fleet.common import FleetEvent

    now = [0.0]
    prog = FleetProgress(console=Console(file=open(os.devnull, "w")), clock=lambda: now[0])  # noqa: SIM115
    spec = ConfigSpec("resnet18", "eager", "fp16", 1, "cuda")
    try:
        for i, lane in enumerate(["cuda:0", "cuda:1", "cuda:0", "cuda:1"]):
            prog.on_event(FleetEvent(i, 8, spec, lane=lane))
            now[0] += 30.0
            prog.on_event(
                FleetEvent(i, 8, spec, Result(spec=spec, status=Status.SKIPPED, reason="x"), lane=lane)
            )
        prog.on_event(FleetEvent(4, 8, spec, lane="cuda:0"))
        prog.on_event(
            Event(5, 8, spec, Result(spec=spec, status=Status.SKIPPED, reason="x"))
        )  # no lane: sweep only
        lines = prog.lane_lines()
        assert set(lines) == {"cuda:0", "cuda:1"}
        assert lines["cuda:0"].startswith("2 done, measuring resnet18") and lines["cuda:1"].startswith(
            "2 done, last:"
        )
        assert prog.sweep_line() == "5/8 done over 2 lane(s), 2m00s elapsed, ETA 1m12s for the whole sweep"
    finally:
        prog.close()
