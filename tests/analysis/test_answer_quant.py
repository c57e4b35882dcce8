"""INT8/FP8 everywhere the answer is made: Table I, recommend, the report's answer, compare, plan, energy.

A fixture store shaped like the default GPU sweep on an H100 (eager beside cudagraph, compile-freeze
and the quant engine at batch 1 and 1024; latencies are made-up round numbers, not measurements): the
quant rows must be in every table, carry their accuracy against fp32, and win where they are fastest.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures_store import _env, make_result

from deepgap.analysis import aggregate, prepare, tables
from deepgap.analysis.recommend import recommend
from deepgap.cli import main
from deepgap.core.records import ConfigSpec
from deepgap.store import Store

PLATFORM = "Fixture GPU Q"
ROWS = [  # engine, precision, memory format, batch, median ms
    ("eager", "fp32", "nchw", 1, 4.5),
    ("eager", "fp32", "nchw", 256, 72.0),
    ("eager", "fp16", "nchw", 1, 6.2),
    ("eager", "fp16", "nchw", 256, 27.0),
    ("cudagraph", "fp16", "channels_last", 1, 1.0),
    ("compile-freeze", "fp16", "channels_last", 256, 10.5),
    ("quant", "int8", "channels_last", 1, 0.33),
    ("quant", "int8", "channels_last", 1024, 25.6),
    ("quant", "fp8", "channels_last", 1, 0.31),
    ("quant", "fp8", "channels_last", 1024, 22.4),
]
ACCURACY = {"int8": (0.045, 0.9990, 0.996), "fp8": (0.061, 0.9981, 0.992)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("q") / "q.sqlite")
    s = Store(path)
    run = s.begin_run(
        {"models": ["resnet50"], "device": "cuda"}, "deepgap run (fixture)", _env("cuda", PLATFORM), "0.1.0"
    )
    for sweep in range(2):
        for engine, prec, mf, bs, ms in ROWS:
            spec = ConfigSpec("resnet50", engine, prec, bs, "cuda", memory_format=mf, sweep=sweep)
            rel, cos, top1 = ACCURACY.get(prec, (1e-3, 0.99999, 1.0))
            tp = bs / (ms / 1e3)
            counter_w, sampled_w = 600.0 + sweep * 20, 520.0  # two sensors, two windows: they disagree
            extra = {
                "correctness": {"rel_l2": rel, "cosine": cos, "top1_agreement": top1, "flagged": False},
                "telemetry": {
                    "mean_power_w": sampled_w,
                    "ips_per_watt": tp * 1.05 / sampled_w,
                    "joules_per_image": counter_w / (tp * 1.05),
                    "power_from_energy_w": counter_w,
                    "energy_j": counter_w * 3.0,
                    "energy_source": "counter",
                    "max_temp_c": 60.0,
                },
            }
            res = make_result(spec, ms / 1e3, extra=extra, mem_bytes=(2 + bs // 64) << 30, shift=sweep)
            s.record(run, res)
    s.finish_run(run, "finished")
    s.close()
    return path


@pytest.fixture(scope="module")
def agg(store):
    s = Store(store, readonly=True)
    df = prepare(s.results_frame())
    s.close()
    return aggregate(df)


def test_table1_has_int8_and_fp8_rows_with_their_accuracy(agg):
    t1 = tables.table1(agg)
    q = t1[t1["precision"].isin(["int8", "fp8"])].set_index("precision")
    assert set(q.index) == {"int8", "fp8"} and set(q["engine"]) == {"quant"}
    assert set(q["platform"]) == {PLATFORM}
    for prec, (rel, cos, top1) in ACCURACY.items():
        assert q.loc[prec, "rel_l2"] == pytest.approx(rel) and q.loc[prec, "cosine"] == pytest.approx(cos)
        assert q.loc[prec, "top1_agreement"] == pytest.approx(top1)
        text = q.loc[prec, "accuracy"]
        assert f"top-1 agreement {100 * top1:.1f}%" in text and "relL2" in text
    assert t1.set_index("precision").loc["fp16", "engine"] == "compile-freeze"


def test_recommend_and_the_reports_answer_consider_the_quant_engine(agg):
    thr, lat = recommend(agg, "throughput")[0], recommend(agg, "latency")[0]
    assert (thr.choice["engine"], thr.choice["precision"], thr.choice["batch_size"]) == ("quant", "fp8", 1024)
    assert (lat.choice["engine"], lat.choice["precision"], lat.choice["batch_size"]) == ("quant", "fp8", 1)
    assert thr.choice["top1_agreement"] == pytest.approx(0.992) and "cosine 0.998" in thr.choice["accuracy"]
    # the report's "The answer" is these two recommendations (deepgap.report.page.build; its figures take 25 s)


def test_recommend_cli_prints_a_quantized_choices_accuracy(store, capsys):
    assert main(["recommend", store]) == 0
    out = capsys.readouterr().out
    assert "resnet50 quant fp8 channels_last bs1024" in out and "accuracy relL2 0.061" in out
    assert main(["recommend", store, "--precision", "fp16"]) == 0
    assert "compile-freeze" in capsys.readouterr().out


def test_energy_rows_include_quant_and_agree(agg):
    en = tables.energy(agg)
    assert {"int8", "fp8"} <= set(en["precision"])
    assert np.allclose(en["ips_per_watt"] * en["joules_per_image"], 1.0, rtol=0.01)
    assert en["mean_power_w"].between(600, 620).all()  # the counter's power, not the sampled 520 W


def test_compare_with_the_paper_puts_quant_int8_beside_tensorrt_int8(store, capsys):
    assert main(["compare", store, "--paper", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["paper"]
    int8 = [r for r in rows if r["precision"] == "int8"]
    assert int8 and {r["paper_engine"] for r in int8} == {"tensorrt"}
    assert all("quant int8" in r["configuration"] and "top-1 agreement 99.6%" in r["accuracy"] for r in int8)
    assert main(["compare", store, store, "--best-only"]) == 0
    out = capsys.readouterr().out
    assert "quant" in out and "top-1 agreement 99.2%" in out.replace("\n", " ")


def test_plan_considers_quant_curves_and_shows_their_accuracy(store, capsys):
    assert main(["plan", store, "--model", "resnet50", "--qps", "50000", "--slo-p99", "50ms", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert " quant fp8" in row["configuration"] and "top-1 agreement 99.2%" in row["configuration"]


def test_figure_frames_hold_int8_and_fp8_rows(agg):
    """What figs. 6-11 are drawn from: the aggregate, and fig. 11's speedup over FP32 (eager NCHW here)."""
    assert {"int8", "fp8"} <= set(agg["precision"])
    sp = tables.speedup_vs_fp32(agg)
    q = sp[sp["engine"] == "quant"]
    # quant's batch 1024 has no fp32 at its batch (eager runs to 256 in the default grid): no row there
    assert set(q["precision"]) == {"int8", "fp8"} and set(q["batch_size"]) == {1}
    assert set(q["baseline_engine"]) == {"eager"} and set(q["baseline_memory_format"]) == {"nchw"}
    r = q[(q["precision"] == "int8") & (q["batch_size"] == 1)].iloc[0]
    assert r["speedup"] == pytest.approx(4.5 / 0.33, rel=1e-6)
