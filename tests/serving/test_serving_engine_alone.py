"""The engine alone that a served capacity is set against: held back to back, its short burst beside it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepgap.serving.run.scenario_context import engine_details, engine_ips, engine_words
from deepgap.serving.worker.server import measure_curve, sustained_s


def test_sustained_warms_one_window_then_times_one_as_long():
    calls: list[tuple[int, int]] = []
    clocks = iter([2.5e-3, 2.6e-3])  # the warm window, then the timed one

    def interval_s(b: int, n: int) -> float:
        calls.append((b, n))
        return next(clocks)

    assert sustained_s(interval_s, 128, 2.4e-3, 1.0) == 2.6e-3
    assert calls == [(128, 417), (128, 417)]  # ceil(1 s / 2.4 ms) batches each


@pytest.mark.parametrize("min_time_s, burst_s", [(0.0, 2.4e-3), (1.0, 0.0)])
def test_sustained_is_the_burst_when_nothing_is_held(min_time_s, burst_s):
    def never(b: int, n: int) -> float:
        raise AssertionError("no window is run")

    assert sustained_s(never, 8, burst_s, min_time_s) == burst_s


class _Executor:
    """A stand-in executor: each engine-alone call at ``n`` batches reports a slower clock than the last."""

    torch = __import__("torch")
    cuda = False
    depth = 1

    def __init__(self, buckets=(2, 4), fixed_s: float = 10e-4) -> None:
        self.buckets = list(buckets)
        self.fixed_s = fixed_s  # the engine's fixed cost a batch, beside 1e-4 s an image
        self.engine_calls: list[tuple[int, int]] = []

    def __call__(self, first: int, count: int) -> tuple[float, float, float, float]:
        return (0.0, 1e-3 * count, 0.0, 1e-5)

    def submit(self, first: int, count: int):
        return count

    def wait(self, t):
        return self(0, t)

    def engine_interval_s(self, b: int, n: int) -> float:
        self.engine_calls.append((b, n))
        return (self.fixed_s + 1e-4 * b) * (1 + 0.01 * len(self.engine_calls))


def test_measure_curve_holds_the_best_batch_and_records_its_burst():
    ex = _Executor()
    _, parts, note = measure_curve(ex, warmup=1, iterations=4, engine_min_time_s=0.01)
    assert note == ""
    # each batch size's burst (iterations // 2 batches); then, at the one whose burst is within 10% of the best
    # rate (batch 4: 2,801 img/s; batch 2 at 1,650 cannot be the best), a warm window and a timed one of ≥ 10 ms
    assert ex.engine_calls == [(2, 2), (4, 2), (4, 8), (4, 8)]
    assert parts[2]["engine_burst_s"] == pytest.approx(1.2e-3 * 1.01)
    assert parts[2]["engine_s"] is None
    assert parts[4]["engine_burst_s"] == pytest.approx(1.4e-3 * 1.02)
    assert parts[4]["engine_s"] == pytest.approx(1.4e-3 * 1.04)
    ctx = SimpleNamespace(parts=parts, req=SimpleNamespace(engine_min_time_s=0.01, seq_lens=()))
    rate, b = engine_ips(ctx)
    assert b == 4 and rate == pytest.approx(4 / parts[4]["engine_s"])
    words = engine_words(ctx)
    assert words.startswith(f"{rate:,.1f} img/s at batch 4, device-resident inputs, held ≥ 0.01 s")
    assert words.endswith(f"a short burst: {4 / parts[4]['engine_burst_s']:,.1f}")
    assert engine_details(ctx) == {
        "engine_ips": rate,
        "engine_batch": 4,
        "engine_held_s": 0.01,
        "engine_burst_ips": pytest.approx(4 / parts[4]["engine_burst_s"]),
    }
    assert engine_details(SimpleNamespace(parts={}, req=ctx.req)) == {}  # no engine alone timed: nothing


def test_every_batch_within_a_tenth_of_the_best_burst_is_held_and_the_best_held_rate_is_the_comparator():
    # batch 16 bursts at 0.93 of batch 32's rate (held), batch 8 at 0.81 (not held)
    ex = _Executor(buckets=(8, 16, 32), fixed_s=3e-4)
    _, parts, _ = measure_curve(ex, warmup=1, iterations=4, engine_min_time_s=0.01)
    assert [b for b, p in parts.items() if p["engine_s"] is not None] == [16, 32]
    assert [b for b, _ in ex.engine_calls] == [8, 16, 32, 16, 16, 32, 32]
    ctx = SimpleNamespace(parts=parts, req=SimpleNamespace(engine_min_time_s=0.01, seq_lens=()))
    # the comparator is the best held rate
    assert engine_ips(ctx) == (pytest.approx(max(b / parts[b]["engine_s"] for b in (16, 32))), 32)


def test_measure_curve_without_a_held_window_keeps_the_burst():
    ex = _Executor()
    _, parts, _ = measure_curve(ex, warmup=1, iterations=4)
    assert [n for b, n in ex.engine_calls] == [2, 2]
    assert parts[4]["engine_s"] == parts[4]["engine_burst_s"]
    assert parts[2]["engine_s"] == parts[2]["engine_burst_s"]
    ctx = SimpleNamespace(parts=parts, req=SimpleNamespace(engine_min_time_s=0.0, seq_lens=()))
    assert "burst" not in engine_words(ctx)


def _args(*argv: str):
    import argparse

    from deepgap.commands.serve import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--model", "tinycnn", *argv])


def test_capacity_tol_sets_the_search_bracket():
    from deepgap.commands.serve import build_spec

    assert build_spec(_args()).rel_tol == 0.03
    assert build_spec(_args("--capacity-tol", "0.01")).rel_tol == 0.01


@pytest.mark.parametrize("value", ["0", "0.9", "nan", "x"])
def test_a_capacity_tol_out_of_range_is_one_line_naming_the_flag(value):
    from deepgap.commands.serve import build_spec
    from deepgap.core.errors import UsageError
    from deepgap.serving.run.spec import validate

    with pytest.raises(UsageError, match="--capacity-tol"):
        validate(build_spec(_args("--capacity-tol", value)))


def test_the_ratio_names_its_upper_end_the_lowest_failing_rate():
    from deepgap.serving.capacity.search import CapacityResult
    from deepgap.serving.run.server_scenario import _bracket
    from deepgap.serving.sim.batcher import BatchPolicy

    best = CapacityResult(BatchPolicy(128, 0.0), 0.015, 48_851.4, 50_029.4, [], "measured")
    assert _bracket(best, 51_390.1) == " (< 0.974: the lowest failing rate, 50,029.4/s)"
    best.upper_qps = None  # no probe failed: no upper end to state
    assert _bracket(best, 51_390.1) == ""


def _store_with_capacities(tmp_path):
    from deepgap.serving.records.details import CapacityDetails
    from deepgap.serving.records.storage import ServeRecord, record
    from deepgap.store import Store

    def cap(qps, **engine):
        return {
            **dict(tenant="", source="measured", model="resnet50", engine="quant", precision="fp8"),
            **dict(device="cuda", memory_format="channels_last", resolution=224, slo_s=0.015),
            **dict(max_batch=128, max_delay_s=0.0, capacity_qps=qps, upper_qps=50_029.4, predicted_qps=qps),
            "details": CapacityDetails(probes=[], **engine),
        }

    held = dict(engine_ips=51_390.1, engine_batch=128, engine_held_s=1.0, engine_burst_ips=51_838.7)
    path = str(tmp_path / "s.sqlite")
    store = Store(path)
    try:
        run = store.begin_run({}, "test", {"device_name": "H"}, "0", kind="serve")
        caps = [cap(48_851.4, **held), cap(40_000.0), cap(45_000.0, **{**held, "engine_held_s": 0.0})]
        record(store, run, ServeRecord({}, "test", {}, levels=[], curves=[], capacities=caps))
    finally:
        store.close()
    return path


@pytest.mark.parametrize(
    "ratio, noted",
    [(0.97, False), (1.02, False), (1.021, True), (1.314, True), (None, False), (float("nan"), False)],
)
def test_a_capacity_above_the_engine_alone_is_noted_never_shown_plainly(ratio, noted):
    from deepgap.serving.records.details import engine_ratio_note
    from deepgap.serving.show import tables

    assert bool(engine_ratio_note(ratio)) is noted
    r = {"capacity_over_engine": ratio, "engine_ips": 16_410.0, "engine_batch": 8, "engine_held_s": 0.0}
    cell = tables.engine_ratio_cell(r)
    assert ("above the engine alone: that figure ran low" in cell) is noted
    if noted:
        assert cell.startswith(f"{ratio:.3f} of 16,410 (bs8, a short burst) (above the engine alone")


def test_show_export_and_the_report_name_the_engine_alone_beside_the_capacity(tmp_path):
    from deepgap.serving.show import tables
    from deepgap.serving.show.export import serve_export
    from deepgap.serving.show.report_section import TABLE_SPECS
    from deepgap.store import Store

    path = _store_with_capacities(tmp_path)
    store = Store(path, readonly=True)
    try:
        cf = tables.capacity(store)
        out = serve_export(store)
    finally:
        store.close()
    cells = [tables.engine_ratio_cell(r) for r in cf.to_dict("records")]
    # a store written before session 46 (no engine fields) shows none; a burst is named as one
    assert cells == ["0.951 of 51,390 (bs128, held 1 s)", "–", "0.876 of 51,390 (bs128, a short burst)"]
    row = out[out["workload"] == "serve-capacity"].iloc[0]
    assert row["capacity_over_engine"] == pytest.approx(48_851.4 / 51_390.1)
    assert (row["engine_batch"], row["engine_held_s"], row["engine_burst_ips"]) == (128, 1.0, 51_838.7)
    _, columns = TABLE_SPECS["serving_capacity"]
    assert ("capacity ÷ engine alone", tables.engine_ratio_cell) in columns
