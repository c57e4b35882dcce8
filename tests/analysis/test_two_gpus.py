"""Two GPU types in one merged store: compare by platform, the roofline's predicted ratio, the paper's
precision mapping and the fleet plan — on fixture stores whose every answer is known by hand.

The fixture "platforms" carry real device names (``NVIDIA H200``, ``NVIDIA H100 80GB HBM3``) so the
datasheet rows match; their numbers are the fixture tables (`fixtures_store`), not measurements:
the H100 side runs every configuration exactly ``SLOW``× slower than the H200 side.
"""

import json

import pytest
from fixtures_store import _env, build_store, make_result

from deepgap.analysis.compare import paper_precision
from deepgap.analysis.platforms import resolve_platform, side_by_side
from deepgap.cli import main
from deepgap.core.errors import UsageError
from deepgap.core.records import ConfigSpec
from deepgap.roofline import predict
from deepgap.roofline.peaks import PeakMeasurement
from deepgap.roofline.storage import record_peaks
from deepgap.store import Store

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
SLOW = 2.0  # H100 latency scale: every matched ratio H200/H100 is exactly 2
# measured ceilings: the same fp16 rate, twice the bandwidth on the H200 (ridges 200 and 400 FLOP/byte)
PEAKS = {H200: {"fp16": 800.0, "memory": 4000.0}, H100: {"fp16": 800.0, "memory": 2000.0}}


def fake_intensity(model, resolution, batch, precision):
    """8 FLOP/byte per image in the batch: bs1 → 8, bs8 → 64, bs32 → 256, bs128 → 1024."""
    return 8.0 * batch


def fake_op_costs(model, resolution):
    """Two ops per image: a "convolution" (1 GFLOP, 1e6 elements) and a "ReLU" (no FLOPs, 1e7 elements)."""
    return [1e9, 0.0], [2e9, 0.0], [1e6, 1e7], [2e6, 2e7]


def _peaks_run(path, name, values):
    s = Store(path)
    try:
        run = s.begin_run({}, "deepgap peaks (fixture)", _env("cuda", name), "0.1.0")
        record_peaks(
            s,
            run,
            [
                PeakMeasurement(
                    k, "bandwidth" if k == "memory" else "matmul", v, "GB/s" if k == "memory" else "TFLOP/s"
                )
                for k, v in values.items()
            ],
        )
        s.finish_run(run)
    finally:
        s.close()


def _tf32_run(path, name):
    """ResNet-50 tf32 eager at batch 32 (1.5× the fp32 fixture's speed) on ``name``."""
    s = Store(path)
    try:
        run = s.begin_run({}, "deepgap run (fixture tf32)", _env("cuda", name), "0.1.0")
        spec = ConfigSpec(model="resnet50", engine="eager", precision="tf32", batch_size=32, device="cuda")
        s.record(run, make_result(spec, 0.040 / 1.5, mem_bytes=2**31))
        s.finish_run(run)
    finally:
        s.close()


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    a, b, out = str(d / "h200.sqlite"), str(d / "h100.sqlite"), str(d / "all.sqlite")
    build_store(a, cpu=False, name=H200)
    build_store(b, cpu=False, name=H100, scale=SLOW)
    for path, name in ((a, H200), (b, H100)):
        _peaks_run(path, name, PEAKS[name])
    _tf32_run(a, H200)
    assert main(["merge", a, b, "-o", out]) == 0
    return {"h200": a, "h100": b, "all": out}


@pytest.fixture
def fake_counts(monkeypatch):
    monkeypatch.setattr(predict, "eager_intensity", fake_intensity)
    monkeypatch.setattr(predict, "eager_op_costs", fake_op_costs)


def test_resolve_platform_by_part_of_the_name():
    names = [H100, H200, "Intel Xeon"]
    assert resolve_platform("h200", names) == H200 and resolve_platform(H100.lower(), names) == H100
    with pytest.raises(UsageError, match="several platforms"):
        resolve_platform("NVIDIA", names)
    with pytest.raises(UsageError, match="no platform 'A100'"):
        resolve_platform("A100", names)


def test_predicted_ratio_by_hand():
    # memory-bound on both sides: the bandwidth ratio; compute-bound on both: the compute ratio
    mem = predict.predicted_ratio(64.0, 64.0, (800.0, 4000.0), (800.0, 2000.0))
    assert mem["predicted_ratio"] == pytest.approx(2.0) and mem["bound"] == "memory"
    comp = predict.predicted_ratio(1024.0, 1024.0, (800.0, 4000.0), (400.0, 2000.0))
    assert comp["predicted_ratio"] == pytest.approx(2.0) and comp["bound"] == "compute"
    # 256 FLOP/byte: right of the H200's ridge (200), left of the H100's (400): 800 / (256 × 2) = 1.5625
    mixed = predict.predicted_ratio(256.0, 256.0, (800.0, 4000.0), (800.0, 2000.0))
    assert mixed["predicted_ratio"] == pytest.approx(800 / 512) and mixed["bound"] == "compute/memory"
    assert (mixed["ridge_a"], mixed["ridge_b"]) == (pytest.approx(200.0), pytest.approx(400.0))


def test_departs_uses_the_measured_ceilings_spread():
    import pandas as pd

    pair = pd.DataFrame(
        [
            dict(model="m", resolution=224, batch_size=8, precision="fp16", platform_a="A", platform_b="B")
            | dict(speedup=2.1, speedup_ci_low=2.05, speedup_ci_high=2.15)
        ]
    )
    a = predict.Roof("A", measured={"fp16": 800.0, "memory": 4000.0})
    b = predict.Roof("B", measured={"fp16": 800.0, "memory": 2000.0})
    out = predict.add_predictions(pair, {"A": a, "B": b}, fake_intensity).iloc[0]
    assert out["predicted_ratio"] == pytest.approx(2.0) and out["departs"]  # 2.0 outside [2.05, 2.15]
    # A's bandwidth repeats spread 3800–4400 GB/s (value × median / per-call): the range 1.9–2.2 overlaps
    details = {"per_call_s": [1 / 3800, 1 / 4000, 1 / 4400]}
    assert predict._repeat_range(4000.0, details) == (pytest.approx(3800.0), pytest.approx(4400.0))
    a.measured_range["memory"] = predict._repeat_range(4000.0, details)
    out = predict.add_predictions(pair, {"A": a, "B": b}, fake_intensity).iloc[0]
    assert out["predicted_ratio_low"] == pytest.approx(1.9)
    assert out["predicted_ratio_high"] == pytest.approx(2.2)
    assert out["departs"] is not None and not out["departs"]
    # no CI: no verdict
    no_ci = pair.assign(speedup_ci_low=float("nan"))
    assert predict.add_predictions(no_ci, {"A": a, "B": b}, fake_intensity).iloc[0]["departs"] is None


def test_compare_platforms_in_a_merged_store(merged, fake_counts):
    out = side_by_side(merged["all"], ["H200", "H100"], n_resamples=400)
    m = out["matched"]
    assert set(m["platform_a"]) == {H200} and set(m["platform_b"]) == {H100}
    assert m["speedup"].to_numpy() == pytest.approx(SLOW)
    assert (m["speedup_ci_low"] < SLOW).all() and (m["speedup_ci_high"] > SLOW).all()
    assert m["configuration_a"].str.contains(f"on {H200}").all()
    assert m["configuration_b"].str.contains(f"on {H100}").all()
    fp16 = m[m["precision"] == "fp16"].set_index(["model", "batch_size"])
    # measured ceilings on both sides: bs1/bs8 memory-bound (2.0 = measured: agrees), bs32 mixed,
    # bs128 compute-bound (1.0: departs)
    assert set(fp16["roofline_source"]) == {"measured peaks (deepgap peaks) of both"}
    r18 = fp16.loc["resnet18"]
    assert list(r18["predicted_ratio"]) == pytest.approx([2.0, 2.0, 800 / 512, 1.0])
    assert list(r18["bound"]) == ["memory", "memory", "compute/memory", "compute"]
    assert list(r18["departs"]) == [False, False, True, True]
    assert r18["measured_over_predicted"].iloc[3] == pytest.approx(2.0)
    # per op, fp16 (2 bytes): the convolution is compute-bound on both (1.25 µs per image vs 0.5 / 1.0 µs of
    # traffic), the ReLU memory-bound (2e7 bytes: 5 µs on the H200, 10 µs on the H100) → 11.25 / 6.25 = 1.8
    assert list(r18["predicted_ratio_per_op"]) == pytest.approx([1.8] * 4)
    assert list(r18["memory_time_share_a"]) == pytest.approx([0.8] * 4)
    assert list(r18["memory_time_share_b"]) == pytest.approx([10 / 11.25] * 4)
    # fp32 has no measured ceiling: the datasheet (H200 SXM vs H100 SXM: 67 TFLOP/s both, 4800 vs 3350 GB/s)
    fp32 = m[(m["precision"] == "fp32") & (m["model"] == "resnet18")].set_index("batch_size")
    assert fp32["roofline_source"].iloc[0] == "datasheet: NVIDIA H200 SXM vs NVIDIA H100 SXM"
    assert fp32.loc[1, "predicted_ratio"] == pytest.approx(4800 / 3350)  # AI 8 < ridges 14.0 and 20.0
    assert fp32.loc[8, "predicted_ratio"] == pytest.approx(1.0) and fp32.loc[8, "bound"] == "compute"
    # tf32 ran on the H200 only: nothing to match
    assert "tf32" not in set(m["precision"])
    # best batch: both at bs128 for resnet18 fp16, energy per image of both sides carried
    best = out["best_batch"].set_index(["model", "precision"])
    assert best.loc[("resnet18", "fp16"), "speedup"] == pytest.approx(SLOW)
    assert best.loc[("resnet18", "fp16"), "joules_per_image_b"] == pytest.approx(
        SLOW * best.loc[("resnet18", "fp16"), "joules_per_image_a"]
    )
    ceil = out["ceilings"].set_index(["platform", "ceiling"])
    assert (
        ceil.loc[(H200, "memory"), "measured"] == 4000.0 and ceil.loc[(H200, "memory"), "datasheet"] == 4800.0
    )
    assert ceil.loc[(H100, "memory"), "measured_over_datasheet"] == pytest.approx(2000 / 3350)


def test_compare_cli_platforms_json_and_table(merged, fake_counts, capsys, tmp_path):
    csv = tmp_path / "h200-vs-h100.csv"
    assert main(["compare", merged["all"], "--platforms", "H200,H100", "--json", "-o", str(csv)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"].endswith(f"(platform {H200})") and doc["b"].endswith(f"(platform {H100})")
    row = next(
        r for r in doc["matched"] if (r["model"], r["precision"], r["batch_size"]) == ("resnet18", "fp16", 1)
    )
    assert row["predicted_ratio"] == pytest.approx(2.0) and row["departs"] is False
    assert row["bound_a"] == row["bound_b"] == "memory"
    text = csv.read_text()
    assert "predicted_ratio" in text.splitlines()[0] and "departs" in text.splitlines()[0]
    # the same from two stores, sides picked by platform
    assert (
        main(["compare", merged["h200"], merged["h100"], "--platforms", f"{H200},{H100}", "--best-only"]) == 0
    )
    out = capsys.readouterr().out
    assert "roofline" in out and "departs" in out and "2.00×" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--platforms", "H200"], "two device names"),
        (["--platforms", "H200,A100"], "no platform 'A100'"),
        (["--platforms", "H200,H200"], "one platform twice"),
    ],
)
def test_compare_platforms_bad_input(merged, argv, needle, capsys):
    assert main(["compare", merged["all"], *argv]) == 2
    assert needle in capsys.readouterr().err


def test_paper_precision_mapping():
    assert paper_precision("NVIDIA L4", "fp32", {"fp32", "tf32"})[0] == "tf32"
    prec, why = paper_precision("NVIDIA L4", "fp32", {"fp32"})
    assert prec == "fp32" and "not like-for-like" in why
    assert paper_precision("NVIDIA T4", "fp32", {"fp32", "tf32"}) == (
        "fp32",
        "paper FP32 on NVIDIA T4 (compute capability 7.5, no TF32) was strict FP32, as deepgap fp32",
    )
    assert paper_precision("Intel Xeon 6 Granite Rapids (24 threads)", "fp32", {"tf32"})[0] == "fp32"
    assert paper_precision("NVIDIA L4", "int8", {"int8"})[0] == "int8"


def test_compare_paper_prints_the_mapping(merged, capsys):
    assert main(["compare", merged["all"], "--paper", "--model", "resnet50", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["platform"], r["paper_platform"], r["paper_precision"]): r for r in doc["paper"]}
    l4 = rows[(H200, "NVIDIA L4", "fp32")]
    assert l4["precision"] == "tf32" and "TF32" in l4["precision_mapping"]
    # tf32 bs32 = 1.5 × fp32 bs32 (32 / 0.040 s = 800 img/s): 1200 img/s against the L4's 1068
    assert l4["throughput_ips"] == pytest.approx(1200.0) and l4["ratio_vs_paper"] == pytest.approx(
        1200 / 1068
    )
    assert rows[(H200, "NVIDIA T4", "fp32")]["precision"] == "fp32"
    assert rows[(H100, "NVIDIA L4", "fp32")]["precision"] == "fp32"  # no tf32 there: labelled
    assert "not like-for-like" in rows[(H100, "NVIDIA L4", "fp32")]["precision_mapping"]
    assert {m["precision"] for m in doc["precision_mapping"]} == {"fp32", "tf32", "fp16"}
    assert main(["compare", merged["all"], "--paper", "--model", "resnet50", "--platforms", "H200,H100"]) == 0
    out = capsys.readouterr().out
    assert "precision set against each paper column" in out and "NVIDIA L4 fp32" in out


def test_plan_across_both_platforms(merged, capsys):
    plan = ["plan", merged["all"], "--qps", "100000", "--slo-p99", "15ms", "--model", "resnet50"]
    plan += ["--min-duration", "0.5s"]
    assert main([*plan, "--json"]) == 0
    rows = {r["platform"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {H200, H100}
    for r in rows.values():
        assert r["devices"] == -(-100000 // r["capacity_qps"])  # ⌈qps / capacity⌉
        assert r["total_power_w"] == pytest.approx(r["devices"] * r["power_w_per_device"])
    # the H100 side is 2× slower at every batch: at least as many devices
    assert rows[H100]["devices"] >= rows[H200]["devices"]
    assert rows[H100]["capacity_qps"] < rows[H200]["capacity_qps"]
    assert rows[H200]["relative_devices"] == pytest.approx(1.0)
    assert rows[H100]["relative_devices"] == pytest.approx(rows[H100]["devices"] / rows[H200]["devices"])
    assert (
        main(
            [
                *plan,
                "--platforms",
                "H100",
                "--precision",  # one curve: the filter and the table are the point (~1.8 CPU-s less)
                "fp32",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert H100 in out and H200 not in out and "devices ÷ #1" in out


def test_plan_power_of_a_serve_curve_comes_from_the_sweep_at_or_above_its_batch():
    from deepgap.serving.capacity.planner import Curve, Prediction, _borrow_sweep_power, plan
    from deepgap.serving.capacity.search import CapacityResult
    from deepgap.serving.sim.batcher import BatchPolicy
    from deepgap.serving.sim.simulator import ServiceModel

    key = dict(
        platform=H200,
        model="resnet50",
        engine="cudagraph",
        precision="fp16",
        memory_format="nchw",
        resolution=224,
        threads=0,
        include_transfer=False,
    )
    sweep = Curve(key, ServiceModel((1, 256), (0.001, 0.02)), "sweep", {1: 150.0, 256: 600.0}, ["r1"])
    serve = Curve(key | {"include_transfer": True}, ServiceModel((1, 8, 64), (0.001, 0.0015, 0.005)), "serve")
    _borrow_sweep_power([sweep, serve])
    assert serve.power_w == {1: 150.0, 256: 600.0} and "runs r1" in serve.power_source
    best = CapacityResult(BatchPolicy(64, 0.0), 0.015, 10_000.0, None)
    p = Prediction(serve, best, [best])
    assert (p.power_batch, p.power_w) == (256, 600.0)  # not batch 1's 150 W: the measured batch above 64
    (row,) = plan([p], 100_000)
    assert (row.devices, row.total_power_w) == (10, 6000.0)
    assert "power at batch 256 (not measured at 64)" in row.note


def test_report_section_tables_and_ratio_figure(merged, fake_counts):
    from deepgap.analysis.platforms_section import SECTION, section
    from deepgap.render.formatting import TABLE_SPECS

    tables, figs = section(merged["all"])
    assert set(tables) == {"platforms_ceilings", "platforms_best_batch", "platforms_matched"}
    assert set(tables) <= set(SECTION.table_specs)  # declared with the section, for the report's build
    assert not set(tables) & set(TABLE_SPECS)  # not added to the formatter's global table
    assert set(tables["platforms_matched"]["platform_a"]) == {H200}  # reverse name order: H200 over H100
    (fig,) = figs
    assert fig.unavailable is None and fig.png.startswith(b"\x89PNG")


def test_the_report_of_a_merged_store_shows_the_platforms_side_by_side(merged, fake_counts, tmp_path):
    from deepgap.cli import main

    out = tmp_path / "r.html"
    # the interactive page (the default): --static drew every figure's PNG too, 3 CPU-s more; static pages
    # are tests/report/test_report_layout.py's and test_report_travels.py's
    assert main(["report", merged["all"], "-o", str(out)]) == 0
    html = out.read_text()
    for anchor in (
        "platforms_ceilings",
        "platforms_best_batch",
        "platforms_matched",
        "fig_platforms_ratio_vs_roofline",
    ):
        assert f'id="{anchor}"' in html
