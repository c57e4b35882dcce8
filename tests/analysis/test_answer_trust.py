"""Issue 35, items 1-6: an answer whose verdicts, tails, capacities, ratios, provenance and warnings hold.

Real rows come from two slices of committed H100 stores (``committed_slices``: the ResNet-101 rows of
``results/h100/default.sqlite`` and of ``results/h100/session9/default.sqlite``, every engine and batch
of that model with its samples and details as the run wrote them). They are representative because
the tests look at ResNet-101 only and aggregate per model: the slices' aggregates and answers equal the
full stores'. Everything else is synthetic: rows built by hand and written with `Store.record`, service
curves, aggregated frames. Each test fails on the code before issue 35.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from committed_slices import unpacked
from fixtures_store import make_result

from deepgap.analysis import accuracy as A  # noqa: N812
from deepgap.analysis import aggregate, prepare
from deepgap.analysis.recommend import recommend
from deepgap.core.precision import PRECISIONS
from deepgap.core.records import ConfigSpec
from deepgap.store import Store


def _frame(path, model=None):
    s = Store(str(path), readonly=True)
    try:
        df = prepare(s.results_frame())
    finally:
        s.close()
    return df[df["model"] == model] if model else df


# --- 1. correctness verdicts that hold -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100_session9_resnet101", "h100_default_resnet101"])
def test_resnet101_answer_is_the_fastest_within_its_precisions_bounds(name, tmp_path):
    """ResNet-101 int8 scored 0% agreement on 1 random-weight input and was flagged, hiding quant fp8."""
    path = unpacked(name, tmp_path)
    agg = aggregate(_frame(path, "resnet101"))
    (rec,) = recommend(agg)
    ok = agg[agg["throughput_ips"].notna()]
    bad = ("wrong-output", "throttle", "power-throttle", "clocks-low", "thermal")
    within = ok[
        [
            r["rel_l2"] <= PRECISIONS[r["precision"]].rel_l2_bound
            and r["cosine"] >= PRECISIONS[r["precision"]].cosine_floor
            and not any(f.startswith(bad) for f in r["flags"])
            for r in ok.to_dict("records")
        ]
    ]
    fastest = within.sort_values("throughput_ips").iloc[-1]
    assert rec.choice["engine"] == fastest["engine"] and rec.choice["precision"] == fastest["precision"]
    assert rec.choice["batch_size"] == fastest["batch_size"]
    if "session9" in name:
        choice = (rec.choice["engine"], rec.choice["precision"], rec.choice["batch_size"])
        assert choice == ("quant", "fp8", 256)
        # its agreement is shown with its n and interval, and said to be synthetic inputs on random weights
        assert "0/8 [0%, 37%] on synthetic inputs" in rec.choice["accuracy"]
        assert "relL2 0.0609 (≤ 0.25)" in rec.choice["accuracy"]


def test_a_flag_never_comes_from_one_noisy_input():
    one = {"correctness": {"rel_l2": 0.017, "cosine": 0.9998, "top1_agreement": 0.0, "n_images": 1}}
    assert A.flags("int8", one) == []
    # trained weights, but one input: no verdict either (MIN_AGREEMENT_N)
    assert A.flags("int8", {"correctness": {**one["correctness"], "weights": "state-dict"}}) == []
    # random weights, 8 inputs, 0 agree: the logits carry no class, so no accuracy flag
    assert A.flags("fp8", {"correctness": {"top1_agreement": 0.0, "n_images": 8, "weights": "random"}}) == []
    # trained weights and an interval that excludes 99%: flagged, with its n and interval
    (f,) = A.flags("int8", {"correctness": {"top1_agreement": 0.9, "n_images": 50, "weights": "state-dict"}})
    assert f.startswith("accuracy-loss(top-1 agreement 45/50 [78%, 97%]") and "trained weights" in f
    lo, hi = A.clopper_pearson(0, 8)
    assert lo == 0.0 and hi == pytest.approx(0.3694, abs=1e-4)
    assert A.parse_min_accuracy("off") == 0.0 and A.threshold("int8", {}, A.OFF) is None
    assert A.threshold("int8", {"min_accuracy": 0.0}) is None  # `run --min-accuracy off`, stored per result
    from deepgap.drive.config import validate
    from deepgap.drive.presets import preset

    assert validate(preset("quick").replace(min_accuracy=A.OFF)).options["min_accuracy"] == 0.0


# --- 2. tails with their sample count -------------------------------------------------------------------


def _tail_store(tmp_path, n_samples_per_repeat):
    """Two configurations: eager fp16 bs1 (2 ms median, a 9 ms outlier) and fp32 bs1 (3 ms, tight)."""
    import deepgap.core.stats as st
    from deepgap.core.records import Result, Status

    path = str(tmp_path / "tails.sqlite")
    s = Store(path)
    run = s.begin_run({}, "fixture", {"device_name": "Fixture GPU A", "device": "cuda"}, "0")
    for prec, med, outlier in (("fp16", 2e-3, 9e-3), ("fp32", 3e-3, 3.1e-3)):
        x = np.full(n_samples_per_repeat * 2, med) * (1 + 0.01 * np.linspace(-1, 1, n_samples_per_repeat * 2))
        x[-1] = outlier
        samples = [list(x[: len(x) // 2]), list(x[len(x) // 2 :])]
        lat = st.summarize(x)
        tp, lo, hi = st.throughput_from_latency(1, lat)
        spec = ConfigSpec(model="resnet50", engine="eager", precision=prec, batch_size=1, device="cuda")
        s.record(
            run,
            Result(
                spec=spec,
                status=Status.OK,
                latency=lat,
                throughput_ips=tp,
                throughput_ci_low_ips=lo,
                throughput_ci_high_ips=hi,
                n_repeats=2,
                samples_s=samples,
            ),
        )
    s.finish_run(run)
    s.close()
    return path


def test_a_p99_of_20_samples_is_labelled_max_of_n(tmp_path):
    agg = aggregate(_frame(_tail_store(tmp_path, 10)))
    fp16 = agg.set_index("precision").loc["fp16"]
    assert fp16["latency_tail_kind"] == "max" and fp16["latency_tail_n"] == 20
    assert fp16["latency_tail_s"] == pytest.approx(9e-3) and "max of 20 samples" in fp16["latency_tail_label"]
    assert math.isnan(fp16["latency_p99_ci_high_s"])  # the bootstrap's upper end was the sample max
    # --slo-p99 checks the max and says so
    (rec,) = recommend(agg, slo_p99_s=5e-3)
    assert rec.choice["precision"] == "fp32" and "max of 20 samples" in rec.choice["latency_tail"]


def test_a_p99_of_400_samples_is_a_p99(tmp_path):
    agg = aggregate(_frame(_tail_store(tmp_path, 200))).set_index("precision")
    assert agg.loc["fp16", "latency_tail_kind"] == "p99" and agg.loc["fp16", "latency_tail_n"] == 400
    assert agg.loc["fp16", "latency_tail_s"] < 9e-3 and "p99 of 400" in agg.loc["fp16", "latency_tail_label"]


# --- 3. plan and capacity explain themselves --------------------------------------------------------------


def _bs1_curve():
    """ResNet-101 cudagraph bs1 as the H100 measured it: 1.76 ms median, 1.87 ms at the top, bs1 only."""
    from deepgap.serving.capacity.planner import Curve
    from deepgap.serving.sim.simulator import ServiceModel

    x = np.linspace(1.70e-3, 1.87e-3, 40)
    key = dict(
        platform="Fixture GPU A",
        model="resnet101",
        engine="cudagraph",
        precision="fp16",
        memory_format="channels_last",
        resolution=224,
        threads=0,
        include_transfer=False,
    )
    return Curve(key, ServiceModel((1,), (float(np.median(x)),), {1: x}, source="sweep"), "sweep", {1: 180.0})


def test_inconclusive_gets_more_queries_not_a_fail():
    """At a 2.5 ms SLO a few Poisson collisions made probes inconclusive: 'not met even at 0.74 q/s'."""
    from deepgap.serving.capacity.planner import plan, predict
    from deepgap.serving.capacity.search import LoadSettings

    p = predict(_bs1_curve(), LoadSettings(slo_s=2.5e-3, min_duration_s=0.5, max_queries=20_000))
    assert p.best.capacity_qps > 3.0, p.best.note  # about 5-9 q/s (M/D/1 with 0.715 ms for a wait)
    (row,) = plan([p], 5000)
    assert row.devices < 2000 and "of the saturation throughput" in row.why and "leaves 0.715 ms" in row.why


def test_every_zero_capacity_gives_its_reason_and_every_engine_is_listed():
    from deepgap.serving.capacity.planner import Curve, plan, predict
    from deepgap.serving.capacity.search import LoadSettings
    from deepgap.serving.sim.simulator import ServiceModel

    fast = _bs1_curve()
    slow = Curve({**fast.key, "engine": "eager"}, ServiceModel((1, 32), (7.5e-3, 20e-3)), "sweep")
    load = LoadSettings(slo_s=3e-3, min_duration_s=0.5, max_queries=4000)
    preds = [predict(c, load) for c in (fast, slow)]
    assert preds[1].best.capacity_qps == 0
    assert "batch 1, takes 7.5 ms (median) ≥ 3 ms" in preds[1].best.note
    (row,) = plan(preds, 100)
    assert row.configuration.startswith("resnet101 cudagraph")
    (alt,) = row.alternatives
    assert alt["configuration"].startswith("resnet101 eager") and "takes 7.5 ms" in alt["why"]


# --- 4. like with like ------------------------------------------------------------------------------------


def _agg_row(**kw):
    base = dict(
        platform="Fixture GPU A",
        device="cuda",
        model="resnet50",
        engine="eager",
        precision="fp32",
        batch_size=1,
        memory_format="nchw",
        threads=0,
        resolution=224,
        include_transfer=False,
        throughput_ips=100.0,
        throughput_ci_low_ips=99.0,
        throughput_ci_high_ips=101.0,
        flagged=False,
        flags=[],
        warnings=[],
        notes=[],
        result_ids=[],
        run_ids=["r"],
        n_measurements=1,
        rel_l2=0.0,
        cosine=1.0,
        top1_agreement=1.0,
        ci_method="fixture",
        throughput_pipelined_ips=np.nan,
        latency_median_s=0.01,
        latency_p99_s=0.011,
        n_runs=1,
        n_excluded=0,
    )
    return {**base, **kw}


def test_best_batch_ratios_say_best_vs_best_and_baselines_are_named():
    from deepgap.analysis import tables
    from deepgap.analysis.compare import compare

    a = pd.DataFrame(
        [_agg_row(batch_size=1, throughput_ips=500.0), _agg_row(batch_size=256, throughput_ips=8800.0)]
    )
    b = pd.DataFrame([_agg_row(batch_size=1, throughput_ips=500.0, platform="Fixture GPU B")])
    none = lambda ids: np.empty(0)  # noqa: E731
    matched, best = compare(a, b, none, none)
    assert matched.iloc[0]["pairing"] == "like with like (bs1 both)"
    pair = best.iloc[0]["pairing"]
    assert pair.startswith("best vs best: A resnet50 eager fp32 bs256")
    assert "B resnet50 eager fp32 bs1" in pair
    # speedup over fp32 names its baseline and says when engine or format differ
    agg = pd.DataFrame(
        [
            _agg_row(batch_size=256, throughput_ips=2200.0),
            _agg_row(
                engine="quant",
                precision="fp8",
                memory_format="channels_last",
                batch_size=256,
                throughput_ips=29000.0,
            ),
        ]
    )
    (sp,) = tables.speedup_vs_fp32(agg).to_dict("records")
    assert sp["baseline"] == "resnet50 eager fp32 bs256 224px" and sp["like_with_like"] is False
    # Table I says which batches a peak was chosen from and which a flag left out
    t1 = tables.table1(
        pd.DataFrame(
            [
                _agg_row(
                    precision="int8",
                    engine="quant",
                    batch_size=1,
                    throughput_ips=900.0,
                    flops_per_image=np.nan,
                ),
                _agg_row(
                    precision="int8",
                    engine="quant",
                    batch_size=256,
                    throughput_ips=20000.0,
                    flagged=True,
                    flags=["accuracy-loss(x)"],
                    flops_per_image=np.nan,
                ),
            ]
        )
    )
    assert t1.iloc[0]["peak_over"] == "best of bs1; excluded: bs256 quant (accuracy-loss)"


# --- 5. provenance ----------------------------------------------------------------------------------------


def test_every_run_records_its_code_and_compare_warns_when_it_differs(tmp_path):
    from clirun import deepgap_cli

    from deepgap.core import envinfo

    src = envinfo.source()
    assert len(src["deepgap_source_sha"]) == 12 and "deepgap_commit" in src
    paths = []
    for i, sha in enumerate(("aaaaaaaaaaaa", "bbbbbbbbbbbb")):
        p = str(tmp_path / f"s{i}.sqlite")
        s = Store(p)
        run = s.begin_run(
            {},
            "fixture",
            {
                "device_name": "Fixture GPU A",
                "device": "cuda",
                "deepgap_source_sha": sha,
                "deepgap_commit": None,
            },
            "0.1.0+src",
        )
        s.record(
            run,
            make_result(
                ConfigSpec(model="resnet50", engine="eager", precision="fp16", batch_size=8, device="cuda"),
                2e-3 * (1 + i),
            ),
        )
        s.finish_run(run)
        s.close()
        paths.append(p)
    r = deepgap_cli("compare", *paths, "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["provenance"]
    assert any("different code: A source aaaaaaaaaaaa; B source bbbbbbbbbbbb" in n for n in notes)
    assert any("different sessions" in n for n in notes) and any("cover neither" in n for n in notes)


# --- 6. warnings that signal ------------------------------------------------------------------------------


def test_power_cap_and_a_steady_temp_rise_are_notes_a_drift_beyond_the_ci_warns(tmp_path):
    path = str(tmp_path / "w.sqlite")
    s = Store(path)
    run = s.begin_run({}, "fixture", {"device_name": "Fixture GPU A", "device": "cuda"}, "0")
    capped = {
        "flags": ["power-throttle", "clocks-low", "temp-rising"],
        "telemetry": {"throttle_fraction": {"sw_power_cap": 0.9}},
        "windows": [{"iterations": 100, "seconds": 1.0}, {"iterations": 100, "seconds": 1.0005}],
    }
    drifting = {
        "flags": ["temp-rising"],
        "windows": [{"iterations": 100, "seconds": 1.0}, {"iterations": 100, "seconds": 1.2}],
    }
    for bs, extra in ((256, capped), (32, drifting)):
        spec = ConfigSpec(model="resnet50", engine="eager", precision="fp16", batch_size=bs, device="cuda")
        s.record(run, make_result(spec, 1e-3 * bs, extra=extra))
    s.finish_run(run)
    s.close()
    agg = aggregate(_frame(path)).set_index("batch_size")
    assert agg.loc[256, "warnings"] == [] and not agg.loc[256, "flagged"]
    notes = {"power-cap", "clocks-low(power-cap)", "temp-rising(no drift beyond CI)"}
    assert set(agg.loc[256, "notes"]) == notes
    (w,) = agg.loc[32, "warnings"]
    assert w.startswith("temp-rising(throughput -16.7% across windows")


def test_not_measured_lists_the_grids_real_gaps(tmp_path):
    from deepgap.analysis.coverage import grid_gaps

    path = unpacked("h100_session9_resnet101", tmp_path)
    gaps = grid_gaps(aggregate(_frame(path, "resnet101")))
    assert "compile-freeze fp16 channels_last: only bs256; never bs1, bs32 (not in the run's grid)" in gaps
    assert any(g.startswith("quant fp8 channels_last: only bs1, bs256; never bs32") for g in gaps)
