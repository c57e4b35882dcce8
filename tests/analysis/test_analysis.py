"""Analysis on fixture stores with known answers: flags, aggregation, Table I, speedups, Pareto, scaling."""

import numpy as np
import pandas as pd
import pytest
from fixtures_store import CPU_MS, GPU_MS, build_store

from deepgap.analysis import aggregate, failures, prepare, row_flags, tables
from deepgap.analysis.reference import paper_peaks
from deepgap.store import Store


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fx") / "fx.sqlite")
    runs = build_store(path)
    s = Store(path, readonly=True)
    df = prepare(s.results_frame())
    s.close()
    return {"path": path, "runs": runs, "df": df, "agg": aggregate(df)}


def _row(agg, **kw):
    m = np.ones(len(agg), dtype=bool)
    for k, v in kw.items():
        m &= agg[k] == v
    assert m.sum() == 1, kw
    return agg[m].iloc[0]


def test_row_flags_reads_correctness_and_contamination():
    assert row_flags({"correctness": {"flagged": True, "rel_l2": 0.5}}) == ["wrong-output(relL2=0.5)"]
    assert row_flags({"flags": ["throttle:thermal", "foreign-process"]}) == [
        "throttle:thermal",
        "foreign-process",
    ]
    assert row_flags({"correctness": {"flagged": False}, "flags": []}) == []
    assert row_flags(None) == [] and row_flags({"flags": "foreign-process"}) == ["foreign-process"]


def test_temp_rising_warns_but_does_not_disqualify():
    from deepgap.analysis.flags import row_warnings

    extra = {"flags": ["temp-rising", "clocks-low"]}
    assert row_flags(extra) == ["clocks-low"]  # a slowdown inside the windows still disqualifies
    assert row_warnings(1, extra) == ["temp-rising"] and row_warnings(0, None) == ["ci-not-met"]
    assert row_flags({"flags": ["temp-rising"]}) == []


def test_the_gpu_holding_its_own_power_limit_warns_an_external_brake_disqualifies():
    from deepgap.analysis.flags import power_capped, row_warnings

    capped = {
        "flags": ["power-throttle", "clocks-low", "temp-rising"],
        "telemetry": {"throttle_fraction": {"sw_power_cap": 0.96}},
    }  # the H100's compiled bs256 runs
    assert power_capped(capped) and row_flags(capped) == []
    assert row_warnings(1, capped) == ["power-cap", "clocks-low(power-cap)", "temp-rising"]
    braked = {
        "flags": ["power-throttle", "clocks-low"],
        "telemetry": {"throttle_fraction": {"sw_power_cap": 0.5, "hw_power_brake_slowdown": 0.2}},
    }
    assert not power_capped(braked) and row_flags(braked) == ["power-throttle", "clocks-low"]
    rare = {"flags": ["clocks-low"], "telemetry": {"throttle_fraction": {"sw_power_cap": 0.05}}}
    assert row_flags(rare) == ["clocks-low"]  # a clock drop the cap does not explain
    thermal = {
        "flags": ["thermal-throttle", "power-throttle"],
        "telemetry": {"throttle_fraction": {"sw_power_cap": 0.9, "sw_thermal_slowdown": 0.5}},
    }
    assert row_flags(thermal) == ["thermal-throttle"] and row_warnings(1, thermal) == ["power-cap"]
    assert row_flags({"flags": ["power-throttle"]}) == ["power-throttle"]  # no per-reason shares stored


def test_aggregate_medians_flags_and_exclusions(fx):
    agg = fx["agg"]
    r = _row(agg, platform="Fixture GPU A", model="resnet18", precision="fp32", batch_size=32)
    assert r["throughput_ips"] == pytest.approx(32 / 0.012)
    assert r["throughput_ci_low_ips"] < r["throughput_ips"] < r["throughput_ci_high_ips"]
    assert r["n_measurements"] == 1 and r["ci_method"] == "within-run bootstrap"
    # 4 sweep passes, one contaminated: 3 used, bootstrap over measurements, the flag counted as excluded
    t = _row(agg, platform="Fixture GPU A", model="resnet18", precision="fp16", batch_size=32)
    assert (t["n_measurements"], t["n_excluded"]) == (3, 1)
    assert t["ci_method"] == "bootstrap over 3 measurements" and not t["flagged"]
    assert t["excluded_flags"] == ["throttle:thermal"]
    w = _row(agg, platform="Fixture GPU A", model="resnet18", precision="int8", batch_size=128)
    assert w["flagged"] and w["flags"] == ["wrong-output(relL2=0.31)"]
    c = _row(agg, platform="Fixture GPU A", model="resnet50", precision="fp16", batch_size=1)
    # a CI wider than its target is shown: a note, not a warning
    assert c["warnings"] == [] and c["notes"] == ["ci-not-met"] and not c["flagged"]
    assert _row(agg, platform="Fixture CPU", model="resnet18", threads=2, batch_size=4)[
        "throughput_ips"
    ] == pytest.approx(100.0)
    # P99 is the worst measurement's and exceeds the median
    assert (agg["latency_p99_s"] > agg["latency_median_s"]).all()


def test_failures_keep_their_reasons(fx):
    f = failures(fx["df"])
    assert sorted(f["status"]) == ["error", "oom", "oom", "skipped"]
    assert any("eager has no int8" in r for r in f["reason"])


def test_table1_known_peaks_skip_flagged_and_cpu_speedup(fx):
    t1 = tables.table1(fx["agg"])
    got = {(r["platform"], r["model"], r["precision"]): r for r in t1.to_dict("records")}
    assert got[("Fixture GPU A", "resnet18", "fp32")]["batch_size"] == 32  # 2667 img/s beats bs128's 2133
    assert got[("Fixture GPU A", "resnet18", "fp16")]["batch_size"] == 128
    # int8 bs128 (21,333 img/s) has wrong outputs: the peak is the best unflagged one
    i8 = got[("Fixture GPU A", "resnet18", "int8")]
    assert i8["batch_size"] == 32 and i8["throughput_ips"] == pytest.approx(16000) and not i8["flagged"]
    cpu = got[("Fixture CPU", "resnet18", "fp32")]
    assert (cpu["batch_size"], cpu["threads"], cpu["speedup_vs_cpu"]) == (4, 2, pytest.approx(1.0))
    assert got[("Fixture GPU A", "resnet18", "fp32")]["speedup_vs_cpu"] == pytest.approx(
        2666.6667 / 100, rel=1e-4
    )
    assert "bs4 2 threads" in got[("Fixture GPU A", "resnet50", "fp32")]["cpu_baseline"]
    assert got[("Fixture GPU A", "resnet18", "fp32")]["achieved_tflops"] == pytest.approx(
        2666.6667 * 1.8e9 / 1e12, rel=1e-4
    )
    assert len(t1) == 7  # 2 CPU + 3 + 2 GPU rows
    assert all("on Fixture" in c for c in t1["configuration"])


def test_table1_flagged_only_group_is_shown_flagged():
    agg = pd.DataFrame(
        [
            {
                "platform": "P",
                "device": "cuda",
                "model": "m",
                "engine": "e",
                "precision": "int8",
                "batch_size": 8,
                "memory_format": "nchw",
                "threads": 0,
                "resolution": 224,
                "include_transfer": False,
                "throughput_ips": 10.0,
                "flagged": True,
                "flags": ["wrong-output"],
                "warnings": [],
                "run_ids": ["r"],
                "n_measurements": 1,
                "n_runs": 1,
                "n_excluded": 0,
                **{
                    c: np.nan
                    for c in [
                        "throughput_ci_low_ips",
                        "throughput_ci_high_ips",
                        "ci_method",
                        "throughput_pipelined_ips",
                        "latency_median_s",
                        "latency_p99_s",
                        "flops_per_image",
                    ]
                },
            }
        ]
    )
    t1 = tables.table1(agg)
    assert bool(t1.loc[0, "flagged"]) and "unavailable" in t1.loc[0, "cpu_baseline"]


def test_pct_of_peak_from_the_one_datasheet():
    assert tables._pct_of_peak("NVIDIA T4", "fp16", 6.5) == pytest.approx(10.0)  # the paper's 65 TFLOPS
    assert tables._pct_of_peak("NVIDIA H100 80GB HBM3", "fp16", 98.94) == pytest.approx(10.0)  # SXM, dense
    assert tables._pct_of_peak("NVIDIA T4", "tf32", 0.81) == pytest.approx(10.0)  # no TF32 on Turing: fp32
    assert np.isnan(tables._pct_of_peak("Intel Xeon 6 (24 threads)", "fp32", 1.0))


def test_speedup_vs_fp32_same_batch(fx):
    sp = tables.speedup_vs_fp32(fx["agg"])
    r = sp[(sp["model"] == "resnet18") & (sp["precision"] == "int8") & (sp["batch_size"] == 32)].iloc[0]
    assert r["speedup"] == pytest.approx(GPU_MS["resnet18"]["fp32"][32] / GPU_MS["resnet18"]["int8"][32])
    assert r["baseline_engine"] == "eager"
    assert bool(sp[(sp["precision"] == "int8") & (sp["batch_size"] == 128)]["flagged"].iloc[0])
    # resnet50 fp16 bs128 has no FP32 partner (FP32 ran out of memory): no row
    assert not ((sp["model"] == "resnet50") & (sp["batch_size"] == 128)).any()


def test_speedup_vs_cpu_and_thread_scaling(fx):
    sc = tables.speedup_vs_cpu(fx["agg"])
    r = sc[(sc["model"] == "resnet50") & (sc["precision"] == "fp16")].iloc[0]
    assert r["speedup_vs_cpu"] == pytest.approx((128 / 0.060) / (4 / 0.110))
    ts = tables.thread_scaling(fx["agg"])
    r = ts[(ts["model"] == "resnet18") & (ts["batch_size"] == 4) & (ts["threads"] == 2)].iloc[0]
    expect = CPU_MS["resnet18"][1][4] / CPU_MS["resnet18"][2][4]
    assert r["speedup_vs_min_threads"] == pytest.approx(expect)
    assert r["parallel_efficiency"] == pytest.approx(expect / 2)


def test_pareto_frontier_excludes_dominated_and_flagged(fx):
    par = tables.pareto(fx["agg"])
    g = par[(par["platform"] == "Fixture GPU A") & (par["model"] == "resnet18")]
    front = {(r["precision"], r["batch_size"]) for r in g[g["on_frontier"]].to_dict("records")}
    # int8 1/8/32 dominate; int8 bs128 is faster still but flagged; fp16 bs128 (18 ms, 7111/s) is dominated by
    # nothing unflagged with ≥ 7111/s at ≤ 18 ms except int8 bs32 (2 ms, 16000/s)
    assert front == {("int8", 1), ("int8", 8), ("int8", 32)}


def test_energy_only_where_telemetry_exists(fx):
    en = tables.energy(fx["agg"])
    assert set(en["platform"]) == {"Fixture GPU A"}
    r = en[(en["model"] == "resnet18") & (en["precision"] == "fp32") & (en["batch_size"] == 8)].iloc[0]
    assert r["joules_per_image"] == pytest.approx((100 + 4) / 2000)


def test_partial_stores(tmp_path):
    """CPU-only, no telemetry; and a store whose every row failed."""
    p = str(tmp_path / "cpu.sqlite")
    build_store(p, gpu=False)
    s = Store(p, readonly=True)
    agg = aggregate(prepare(s.results_frame()))
    s.close()
    assert tables.energy(agg).empty and tables.speedup_vs_cpu(agg).empty and tables.speedup_vs_fp32(agg).empty
    assert len(tables.table1(agg)) == 2
    empty = aggregate(
        prepare(
            pd.DataFrame([{"status": "oom", "device": "cuda", "device_name": "G", "extra": {}, "model": "m"}])
        )
    )
    assert empty.empty and tables.table1(empty).empty and tables.pareto(empty).empty


def test_reference_data_ships_with_the_package():
    p = paper_peaks()
    assert set(p["platform"]) == {"NVIDIA T4", "NVIDIA L4", "Intel Xeon 6 Granite Rapids (24 threads)"}
    r = p[(p["platform"] == "NVIDIA L4") & (p["model"] == "resnet18") & (p["precision"] == "int8")].iloc[0]
    assert (r["peak_batch"], r["peak_images_per_s"]) == (32, 38932)
    from deepgap.roofline.specs import spec_by_gpu, spec_peak

    assert [spec_peak(spec_by_gpu(g), "fp16") for g in ("NVIDIA T4", "NVIDIA L4")] == [65.0, 121.0]


def test_energy_rows_come_from_one_window(tmp_path):
    """images/s/W × J/image = 1 on every row; mean power is the counter's, not the sampled driver power."""
    path = str(tmp_path / "e.sqlite")
    build_store(path, cpu=False)
    s = Store(path, readonly=True)
    raw = s.results_frame()
    s.close()
    rng = np.random.default_rng(0)
    extras = []
    for e in raw["extra"]:
        e = e.to_json()  # a parsed JSON object: what the analysis reads as well as typed details
        tel = dict(e.get("telemetry") or {})
        if tel:  # the H100 row: sampled 596 W and its images/s/W, counter 686 W and its joules
            jpi = tel["joules_per_image"] * rng.uniform(1.1, 1.6)
            tel.update(
                joules_per_image=jpi, power_from_energy_w=tel["mean_power_w"] * 1.15, energy_source="counter"
            )
        e["telemetry"] = tel
        extras.append(e)
    raw["extra"] = extras
    en = tables.energy(aggregate(prepare(raw)))
    assert len(en) > 5 and (aggregate(prepare(raw))["n_measurements"] > 1).any()
    prod = en["ips_per_watt"] * en["joules_per_image"]
    assert np.allclose(prod, 1.0, rtol=0.01), en[["ips_per_watt", "joules_per_image"]]
    df = prepare(raw)
    for e, p in zip(raw["extra"], df["mean_power_w"], strict=True):
        if e["telemetry"]:
            assert p == pytest.approx(e["telemetry"]["power_from_energy_w"])
    # no energy measured: the sampled figures are all there is, and they are kept
    assert (
        prepare(
            pd.DataFrame(
                {
                    "extra": [{"telemetry": {"mean_power_w": 50.0, "ips_per_watt": 3.0}}],
                    "device": ["cuda"],
                    "status": ["ok"],
                }
            )
        )["ips_per_watt"].iloc[0]
        == 3.0
    )
