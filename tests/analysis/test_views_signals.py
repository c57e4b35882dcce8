"""Issue 49, items 7 and 8: signals, not noise; a plan and a capacity verdict that say what limits them.

Why one file: each test pins one view that called noise a signal (54 of 88 rows flagged in `show`, a
−0.3% drift inside its interval highlighted, a 2× disagreement between sweeps blamed on heat, a
zero-initialised ViT head read as ``WRONG``) or a plan that did not say what limited it; each fails on
the code before the issue. Stores are written through `Store.record` (`tests/fixtures_store.py`),
milliseconds each, and read in this process.
"""

from __future__ import annotations

import pytest
from clirun import deepgap_cli
from fixtures_store import configurations, make_result

from deepgap.analysis import signals
from deepgap.core.records import ConfigSpec
from deepgap.store import Store

GPU = {"device_name": "Fixture GPU A", "device": "cuda"}
CAPPED = {  # the GPU at its own power limit, still warming, its windows steady: notes only
    "flags": ["power-throttle", "clocks-low", "temp-rising"],
    "telemetry": {"throttle_fraction": {"sw_power_cap": 0.9}},
    "windows": [{"iterations": 100, "seconds": 1.0}, {"iterations": 100, "seconds": 1.0005}],
}


def _windows(*rates: float) -> list[dict]:
    return [{"iterations": r, "seconds": 1.0} for r in rates]


def _spec(bs: int = 8, sweep: int = 0, **kw) -> ConfigSpec:
    return ConfigSpec(
        model=kw.pop("model", "resnet50"),
        engine="eager",
        precision="fp16",
        batch_size=bs,
        device="cuda",
        sweep=sweep,
        **kw,
    )


def _store(path: str, rows: list[tuple[ConfigSpec, float, dict]]) -> str:
    s = Store(path)
    run = s.begin_run({"device": "cuda"}, "deepgap run (fixture)", dict(GPU), "0")
    for spec, latency_s, extra in rows:
        s.record(run, make_result(spec, latency_s, extra=extra))
    s.finish_run(run)
    s.close()
    return path


# --- 7. signals, not noise ----------------------------------------------------------------------
def test_show_separates_notes_from_warnings(tmp_path):
    """A power-capped, steady row carries notes only; a row whose windows fell 20% warns; `show` says which.

    Before: every stored flag (power-throttle, clocks-low, temp-rising, ci-not-met) sat in one "flags"
    column: 54 of 88 rows of a default H200 run, none of which the report counted against its number.
    """
    path = _store(
        str(tmp_path / "show.sqlite"),
        [
            (_spec(256), 8e-3, CAPPED),
            (_spec(32), 2e-3, {"flags": ["temp-rising"], "windows": _windows(100, 90, 80)}),
        ],
    )
    r = deepgap_cli("show", path)
    assert r.returncode == 0, r.stderr
    assert "1 of 2 results flagged or warned" in r.stdout and "1 carry notes only" in r.stdout
    s = Store(path, readonly=True)
    from deepgap.commands.show import signals_of

    against, notes = signals_of(s.results_frame())
    s.close()
    assert against[0] == [] and {"power-cap", "clocks-low(power-cap)"} <= set(notes[0])
    assert len(against[1]) == 1 and against[1][0].startswith("temp-rising(throughput -20.0% across windows")


def test_a_drift_inside_the_ci_is_not_highlighted():
    """The rule: a highlight means the number can move beyond its CI.

    The number is the windows' mean; a GPU still warming settles at its last window, so it can move by
    last / mean − 1. A −0.3% first-to-last drift moves it −0.15%: inside a ±0.2% interval, a note.
    Before: any first-to-last drift beyond the half-width warned (−0.3% > 0.2%: yellow on the answer).
    """
    extra = {"windows": _windows(1000, 998.5, 997)}
    drift, shift = signals.window_drift(extra), signals.window_shift(extra)
    assert drift == pytest.approx(-0.003) and shift == pytest.approx(-0.0015, rel=0.01)
    warn, notes = signals.split(["temp-rising"], drift, 0.002, shift)
    assert warn == [] and notes == [signals.STEADY]
    warn, _ = signals.split(["temp-rising"], -0.02, 0.002, -0.01)  # moves −1% against ±0.2%: a warning
    assert warn == ["temp-rising(throughput -2.0% across windows: last window -1.0% vs their mean, CI ±0.2%)"]


def test_sweeps_that_disagree_are_named_not_blamed_on_heat(tmp_path):
    """Two sweeps 2× apart, one warming 10% within its windows: the configuration names the disagreement.

    Its two-level interval covers both sweeps, so neither the drift nor the disagreement can move the
    number beyond it: both are notes, and the disagreement is called what it is, with how far apart.
    Before: ``temp-rising(throughput -9.7% …)`` was its warning and the 2× gap a note "spread".
    """
    warming = {"flags": ["temp-rising"], "windows": _windows(100, 95, 90)}
    path = _store(str(tmp_path / "sweeps.sqlite"), [(_spec(32, 0), 1e-3, warming), (_spec(32, 1), 2e-3, {})])
    (row,) = configurations(path).to_dict("records")
    assert row["warnings"] == []
    assert "sweeps-disagree(fastest +100% over slowest, covered by the CI)" in row["notes"]
    assert signals.STEADY in row["notes"]
    assert not any("spread" in n for n in row["notes"])


def test_degenerate_output_says_so_and_is_not_wrong(tmp_path):
    """All-zero logits (a random ViT's zero head): a note naming them and ``--weights``, never ``WRONG``."""
    import torch

    from deepgap.measure import correctness

    zero = torch.zeros(2, 10)
    a = correctness.compare(zero, zero, "fp16")
    assert a.degenerate == "all-zero logits" and not a.flagged
    assert correctness.compare(torch.ones(2, 10), zero, "fp16").flagged  # an engine not zero where it is
    assert correctness.degenerate(torch.full((2, 10), 3.0)) == "constant logits"
    assert correctness.degenerate(torch.randn(2, 10)) == ""
    # a store from before the field: relL2 0 and cosine 0 exactly are the zero vectors' signature
    old = {"correctness": {"rel_l2": 0.0, "cosine": 0.0, "flagged": True, "top1_agreement": 1.0}}
    path = _store(str(tmp_path / "vit.sqlite"), [(_spec(8, model="vit_b_16"), 3e-3, old)])
    (row,) = configurations(path).to_dict("records")
    assert not row["flagged"] and row["flags"] == []
    assert any(n.startswith("degenerate-output(all-zero logits") and "--weights" in n for n in row["notes"])
    r = deepgap_cli("show", path)
    assert "WRONG" not in r.stdout and "degenerate-output(all-zero" in r.stdout and "--weights" in r.stdout


def test_zero_initialised_head_gets_informative_weights():
    """A linear layer built all-zero (torchvision's ViT head) gets seeded N(0, 1/fan_in) weights."""
    import torch

    from deepgap.measure.models.build import inform_zero_layers

    def model():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
        torch.nn.init.zeros_(m[2].weight)
        torch.nn.init.zeros_(m[2].bias)
        return m

    a, b = model(), model()
    assert inform_zero_layers(a, seed=0) == ["2"] and inform_zero_layers(b, seed=0) == ["2"]
    assert torch.equal(a[2].weight, b[2].weight)  # seeded: the same model every build
    y = a(torch.randn(4, 8)).detach()
    assert float(y.std()) > 0 and signals.DEGENERATE  # its outputs now carry information
    from deepgap.measure.correctness import degenerate

    assert degenerate(y) == ""


def test_plan_reports_the_agreements_n(tmp_path):
    """`plan` prints the agreement as k/n with its interval where n is stored, never "(n not recorded)"."""
    check = {"correctness": {"rel_l2": 0.02, "cosine": 0.999, "top1_agreement": 1.0, "n_images": 8}}
    spec = ConfigSpec(model="resnet50", engine="quant", precision="int8", batch_size=8, device="cuda")
    path = _store(str(tmp_path / "plan.sqlite"), [(spec, 2e-3, check)])
    r = deepgap_cli("plan", path, "--qps", "100", "--slo-p99", "50ms", "--model", "resnet50")
    assert r.returncode == 0, r.stderr
    assert "n not recorded" not in r.stdout and "top-1 agreement 8/8" in r.stdout


# --- 8. plan and capacity ------------------------------------------------------------------------
def test_a_conclusive_over_slo_fraction_is_a_fail():
    """26 of 578 served requests over a p99 SLO (4.5%) is conclusively above 1%: a fail.

    Before: a level that stopped once it could no longer pass was judged against the 2,000 requests it
    had planned, and 26 of those read "inconclusive".
    """
    import numpy as np

    from deepgap.serving.sim.log import RequestLog, summarize

    n, over, slo = 578, 26, 15e-3
    lat = np.full(n, 5e-3)
    lat[:over] = 30e-3
    arrival = np.arange(n) * 1e-3
    zeros = np.zeros(n)
    log = RequestLog(arrival, arrival, arrival + lat, np.ones(n, dtype=np.int64), zeros, lat, zeros)
    log.n_planned, log.stop_kind, log.stopped = 2000, "violations", "could no longer pass"
    s = summarize(log, 1000.0, slo)
    assert (s.n, s.n_over_slo, s.verdict) == (n, over, "fail")


def _plan_store(path: str) -> str:
    """A GPU quant engine at batch 1 (0.6 ms) and 256 (8 ms); a CPU eager engine at 1 and 16 threads."""
    s = Store(path)
    run = s.begin_run({"device": "cuda"}, "deepgap run (fixture)", dict(GPU), "0")
    for bs, ms in ((1, 0.6), (256, 8.0)):
        spec = ConfigSpec(model="resnet50", engine="quant", precision="int8", batch_size=bs, device="cuda")
        s.record(run, make_result(spec, ms / 1e3))
    s.finish_run(run)
    run = s.begin_run(
        {"device": "cpu"}, "deepgap run (fixture)", {"device_name": "Fixture CPU", "device": "cpu"}, "0"
    )
    for threads, ms in ((1, 40.0), (16, 9.0)):
        spec = ConfigSpec(
            model="resnet50", engine="eager", precision="fp32", batch_size=1, device="cpu", threads=threads
        )
        s.record(run, make_result(spec, ms / 1e3))
    s.finish_run(run)
    s.close()
    return path


def test_plan_says_the_grid_limits_it_and_names_cpu_threads(tmp_path):
    """At a 3 ms SLO the GPU can only serve batch 1: the plan says the grid limits it, and what to measure.

    Nothing between 1 and 256 was measured; a batch interpolated between 0.6 ms and 8 ms fits 3 ms up to
    about 80, so the plan names powers of two in that range. The CPU's two thread variants are named.
    """
    path = _plan_store(str(tmp_path / "grid.sqlite"))
    r = deepgap_cli("plan", path, "--qps", "2000", "--slo-p99", "3ms", "--model", "resnet50", "--json")
    assert r.returncode == 0, r.stderr
    import json

    rows = {row["platform"]: row for row in json.loads(r.stdout)}
    gpu = rows["Fixture GPU A"]
    assert "grid-limited: batch 1 (0.6 ms) is the largest measured within the 3 ms SLO" in gpu["why"]
    assert gpu["note"].endswith("grid-limited: measure --batch-sizes 2,8,16,64") or (
        "grid-limited: measure --batch-sizes 2,8,16,64" in gpu["note"]
    )
    cpu = rows["Fixture CPU"]
    names = [cpu["configuration"], *(a["configuration"] for a in cpu["alternatives"])]
    assert any("eager fp32 16 threads" in n for n in names) and any(
        "eager fp32 1 thread " in n for n in names
    )


def test_grid_limit_rules():
    """No gap, no note; a grid above the SLO names the batches below it; a grid far under it names larger."""
    from deepgap.serving.capacity.grid_limit import grid_limit
    from deepgap.serving.sim.simulator import ServiceModel

    def curve(times: dict[int, float]) -> ServiceModel:
        return ServiceModel.from_function(lambda b: times[b], sorted(times), padding="bucket")

    assert grid_limit(curve({1: 1e-3, 2: 2e-3, 4: 4e-3}), 3e-3) == ""  # 2 fits, 4 does not: no gap
    assert grid_limit(curve({256: 14e-3}), 3e-3).endswith("--batch-sizes 1,4,8,32")  # 14 ms × x / 256 < 3 ms
    assert grid_limit(curve({1: 1e-3, 8: 2e-3}), 30e-3).endswith("--batch-sizes 16,32")
    exact = ServiceModel.from_function(lambda b: 1e-3 * b, [1, 256], padding="exact")
    assert grid_limit(exact, 3e-3) == ""  # exact padding interpolates between measured batches
