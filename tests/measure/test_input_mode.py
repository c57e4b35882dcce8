"""The input axis (issue 47): ``--inputs default,int8-resident``, measured beside the default, never mixed.

Plan and key (a default configuration's key is what every stored run holds), the measurement through
`deepgap.measure.configuration` with a fake CPU engine whose resident input is int8, and a fixture store
(`fixtures_store.make_result`: made-up round numbers, not measurements) holding default and resident rows
of one configuration: aggregation keeps them apart, the answer ignores the resident row and shows it
beside itself with MLPerf's number and conditions, and show, export, the report's tables and figures and
compare label it.
"""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from clirun import deepgap_cli
from fixtures_store import _env, make_result

from deepgap.analysis import aggregate, config_label, prepare
from deepgap.core.records import INPUT_MODES, KEY_ONLY_FIELDS, ConfigSpec, Status
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand
from deepgap.store import Store

H200 = "Fixture H200"  # the MLPerf anchor's GPU named (a fixture, not a measurement of one)
OTHER = "Fixture GPU A"
ROWS = [  # engine, precision, memory format, batch, input, median ms
    ("eager", "fp32", "nchw", 256, None, 72.0),
    ("eager", "fp16", "nchw", 256, None, 27.0),
    ("quant", "int8", "channels_last", 256, None, 6.8),
    ("quant", "int8", "channels_last", 256, "int8-resident", 4.0),  # faster: never the answer
]
MLPERF_CONDITIONS = (
    "v5.0",
    "Offline",
    "95,089 img/s",
    "TensorRT INT8",
    "batch 2048",
    "resident in GPU memory",
)


# --- key, plan, validation --------------------------------------------------------------------------------
def test_a_default_key_is_unchanged_and_a_resident_key_names_its_input():
    default = ConfigSpec("resnet50", "quant", "int8", 8, "cuda")
    assert default.key == (
        '{"batch_size":8,"device":"cuda","engine":"quant","include_transfer":false,'
        '"memory_format":"nchw","model":"resnet50","precision":"int8","resolution":224,'
        '"sweep":0,"threads":null}'
    )  # the key of every stored run: resume and merge unchanged
    resident = ConfigSpec("resnet50", "quant", "int8", 8, "cuda", input_mode="int8-resident")
    assert json.loads(resident.key)["input_mode"] == "int8-resident" and resident.key != default.key
    assert ConfigSpec.from_key(resident.key) == resident and ConfigSpec.from_key(default.key) == default
    assert (
        ConfigSpec.input_mode_of(resident.key) == "int8-resident"
        and ConfigSpec.input_mode_of(default.key) is None
    )
    assert resident.label().endswith(" int8-resident") and "resident" not in default.label()
    assert resident.group != default.group  # an OOM of one never skips the other's larger batches
    assert "input_mode" in KEY_ONLY_FIELDS and INPUT_MODES[:2] == (
        "default",
        "int8-resident",
    )  # + text inputs


def test_plan_pairs_each_engine_with_the_inputs_it_takes():
    spec = validate(
        SweepSpec(
            models=("tinycnn",),
            engines=("eager", "quant"),
            precisions=("fp32", "int8"),
            batch_sizes=(1, 8),
            device="cpu",
            inputs=("default", "int8-resident"),
        )
    )
    plan = expand(spec, "cpu")
    got = {(c.engine, c.precision, c.input_mode) for c in plan}
    assert got == {("eager", "fp32", None), ("quant", "int8", None), ("quant", "int8", "int8-resident")}
    assert len(plan) == 6  # two batch sizes each
    default_only = expand(validate(spec.replace(inputs=("default",))), "cpu")
    assert [c.key for c in default_only] == [
        c.key for c in plan if c.input_mode is None
    ]  # as before the axis


def test_a_config_file_takes_the_inputs_axis(tmp_path):
    from deepgap.drive.presets import load_toml, preset

    p = tmp_path / "sweep.toml"
    p.write_text('engines = ["quant"]\nprecisions = ["int8"]\ninputs = ["default", "int8-resident"]\n')
    assert load_toml(str(p)).inputs == ("default", "int8-resident")
    assert preset("gpu").inputs == ("default",)  # presets unchanged: the default input only


# --- the measurement: a fake CPU engine whose resident input is int8 --------------------------------------
def _measure_fake_engines() -> dict:
    import torch

    from deepgap.measure.configuration import measure
    from deepgap.measure.engines import ENGINES, Engine, Prepared
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.timing import TimingProtocol
    from deepgap.measure.worker import WorkerState

    seen: dict[str, list] = {"made": [], "run": []}

    class Resident(Engine):  # quantizes the fp32 batch once (make_input); its run dequantizes
        name = "resident-fake"
        precisions = ("int8",)
        inputs = ("default", "int8-resident")

        def prepare(self, model, spec, example):
            scale = float(example.abs().max()) / 127.0

            def make_input(x):
                seen["made"].append((x.dtype, str(x.device)))
                return (x / scale).round().clamp(-127, 127).to(torch.int8)

            def run(x):
                seen["run"].append(x.dtype)
                return model(x.float() * scale if x.dtype == torch.int8 else x)

            return Prepared(run=run, input_dtype=torch.float32, make_input=make_input)

    class NoMaker(Resident):  # says it takes the input, makes none: an error row, never the default input
        name = "resident-nomaker"

        def prepare(self, model, spec, example):
            return Prepared(run=model, input_dtype=torch.float32)

    ENGINES.add("resident-fake", Resident)
    ENGINES.add("resident-nomaker", NoMaker)
    state = WorkerState("cpu")
    protocol = TimingProtocol(warmup=1, iterations=3, repeats=2)
    out = {}
    for engine, precision, mode in (
        ("resident-fake", "int8", "int8-resident"),
        ("resident-nomaker", "int8", "int8-resident"),
        ("eager", "fp32", "int8-resident"),
    ):
        spec = ConfigSpec("tinycnn", engine, precision, 4, "cpu", resolution=32, threads=1, input_mode=mode)
        out[engine] = measure(state, MeasureRequest(spec=spec, protocol=protocol))
    out["seen"] = {k: list(v) for k, v in seen.items()}
    # accuracy mode scores the input that was timed: 6 labelled images (made up) in batches of 4, no files
    from deepgap.measure.accuracy import evaluate

    def data(state, info, resolution, options):
        state.accuracy_cache = getattr(state, "accuracy_cache", None) or {}
        g = torch.Generator().manual_seed(0)
        return torch.randint(
            0, 256, (6, 3, resolution, resolution), dtype=torch.uint8, generator=g
        ), torch.arange(6) % 2

    seen["made"].clear()
    seen["run"].clear()
    spec = ConfigSpec(
        "tinycnn", "resident-fake", "int8", 4, "cpu", resolution=32, threads=1, input_mode="int8-resident"
    )
    options = {"dataset": {"sha": "fixture", "subset": "all"}}
    real, evaluate._data = evaluate._data, data
    try:
        out["accuracy"] = measure(state, MeasureRequest(spec=spec, protocol=protocol, options=options))
    finally:
        evaluate._data = real
    out["seen_accuracy"] = seen
    return out


@pytest.fixture(scope="module")
def measured():
    import torch

    from deepgap.measure.engines import ENGINES, load_engines

    load_engines()
    threads, registered = torch.get_num_threads(), dict(ENGINES._entries)
    try:
        yield _measure_fake_engines()
    finally:
        torch.set_num_threads(threads)
        ENGINES._entries.clear()
        ENGINES._entries.update(registered)


def test_the_timed_input_is_the_engines_resident_one_made_once(measured):
    import torch

    res = measured["resident-fake"]
    assert res.status == Status.OK, res.reason
    assert measured["seen"]["made"] == [(torch.float32, "cpu")]  # once, from the fp32 batch on the device
    assert measured["seen"]["run"] and set(measured["seen"]["run"]) == {torch.int8}  # every call, timed too
    assert (
        res.details.correctness.flagged is False
    )  # its logits against the fp32 reference on the same images
    assert res.details.transfer.startswith("none: int8-resident input made on the device")


def test_accuracy_mode_scores_the_resident_input(measured):
    import torch

    acc = measured["accuracy"].details.accuracy
    assert acc is not None and acc.error is None, acc
    assert acc.n == 6 and acc.top1_agreement_fp32 is not None
    made = measured["seen_accuracy"]["made"]
    assert made[-2:] == [(torch.float32, "cpu")] * 2  # the two scored batches, each made from fp32 as timed
    assert set(measured["seen_accuracy"]["run"]) == {torch.int8}


def test_no_make_input_is_an_error_and_an_engine_without_the_input_is_skipped(measured):
    err, skip = measured["resident-nomaker"], measured["eager"]
    assert err.status == Status.ERROR and "gave no make_input for the int8-resident input" in err.reason
    assert skip.status == Status.SKIPPED and "has no int8-resident input" in skip.reason


# --- a store with default and resident rows of one configuration -------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("im") / "im.sqlite")
    s = Store(path)
    for platform in (H200, OTHER):
        run = s.begin_run(
            {"models": ["resnet50"], "device": "cuda"},
            "deepgap run (fixture)",
            _env("cuda", platform),
            "0.1.0",
        )
        for sweep in range(2):
            for engine, prec, mf, bs, mode, ms in ROWS:
                spec = ConfigSpec(
                    "resnet50", engine, prec, bs, "cuda", memory_format=mf, sweep=sweep, input_mode=mode
                )
                s.record(run, make_result(spec, ms / 1e3, mem_bytes=8 << 30, shift=sweep))
        s.finish_run(run, "finished")
    s.close()
    return path


@pytest.fixture(scope="module")
def frames(store):
    s = Store(store, readonly=True)
    try:
        df = prepare(s.results_frame())
        return df, aggregate(df, samples=s.samples)
    finally:
        s.close()


def test_aggregation_never_pools_resident_rows_with_default_ones(frames):
    df, agg = frames
    q = agg[(agg["engine"] == "quant") & (agg["platform"] == H200)].set_index("input_mode")
    assert sorted(q.index) == ["", "int8-resident"]
    assert q.loc["", "throughput_ips"] == pytest.approx(256 / 6.8e-3)
    assert q.loc["int8-resident", "throughput_ips"] == pytest.approx(256 / 4.0e-3)
    assert (q["n_measurements"] == 2).all()  # each its own two sweeps, nothing of the other
    assert "int8-resident input (int8 images resident in GPU memory, MLPerf-like)" in config_label(
        q.reset_index().iloc[1]
    )


def test_the_answer_ignores_the_resident_row_and_shows_it_beside_itself(frames):
    from deepgap.analysis import tables
    from deepgap.analysis.recommend import RESIDENT_REASON, recommend
    from deepgap.report.answer import answers

    df, agg = frames
    for rec in recommend(agg[agg["platform"] == H200]):
        assert rec.choice["configuration"].startswith("resnet50 quant int8 channels_last bs256 224px on")
        assert "resident" not in rec.choice["configuration"] and rec.excluded == {RESIDENT_REASON: 1}
    table, _ = answers(agg, df)
    h200 = table[table["platform"] == H200]
    answered = h200[h200["goal"] == "throughput"].iloc[0]
    assert answered["configuration"] == "quant int8 channels_last bs256"  # the default input's
    line = h200[h200["goal"] == "int8 images resident in GPU memory, MLPerf-like"].iloc[0]
    assert line["configuration"] == "quant int8 channels_last bs256 int8-resident"
    assert line["value"] == f"{256 / 4e-3:,.1f} img/s" and "not the answer" in line["also"]
    assert all(c in line["also"] for c in MLPERF_CONDITIONS) and "MaxQ: 350 W power cap" in line["also"]
    other = table[(table["platform"] == OTHER) & table["goal"].str.contains("resident")].iloc[0]
    assert "no MLPerf anchor for Fixture GPU A" in other["also"] and "95,089" not in other["also"]
    t1 = tables.table1(agg)
    int8 = t1[(t1["platform"] == H200) & (t1["precision"] == "int8")].set_index("input_mode")
    assert sorted(int8.index) == ["", "int8-resident"]  # a row of its own, never the default's peak
    assert "int8-resident" in int8.loc["int8-resident", "configuration"]
    assert "int8-resident" not in int8.loc["", "configuration"]


def test_capacity_planning_reads_the_default_input_only(store):
    from deepgap.serving.capacity.planner import curves_from_store

    s = Store(store, readonly=True)
    try:
        curves = [c for c in curves_from_store(s) if c.key["engine"] == "quant"]
    finally:
        s.close()
    assert len(curves) == 2  # one per platform, from the default rows: no resident sample pooled in
    assert all(c.service.median_s == pytest.approx((6.8e-3,)) for c in curves)


def test_the_reports_tables_and_figures_label_it(frames):
    from deepgap.analysis import tables
    from deepgap.render.formatting import TABLE_SPECS, csv_frame, html_table
    from deepgap.render.style import overlay_series, series_label
    from deepgap.report.interactive import lines

    _, agg = frames
    t1 = html_table("table1_peak_throughput", tables.table1(agg))
    precs = [r["cells"][2] for r in t1["rows"]]
    assert "int8 · int8-resident" in precs and "int8" in precs
    conf = html_table("configurations", agg, TABLE_SPECS["configurations"])
    assert "quant · int8-resident" in [r["cells"][2] for r in conf["rows"]]
    assert csv_frame(agg)["input_mode"].tolist().count("int8-resident") == 2  # the column, in the files
    assert "input_mode" not in csv_frame(agg[agg["input_mode"] == ""])  # a default-only file: as before
    sub = agg[agg["platform"] == H200]
    names = sorted(series_label(g.iloc[0]) for _, g in overlay_series(sub))
    assert "quant int8 channels_last int8-resident" in names and "quant int8 channels_last" in names
    spec = lines(sub, "throughput_ips", "img/s")
    traces = [t for t in spec["data"] if t.get("name", "").startswith("quant")]
    assert {t["name"] for t in traces} >= {
        "quant int8 channels_last int8-resident",
        "quant int8 channels_last",
    }
    assert any("int8-resident" in h[0] for t in traces for h in t["customdata"])  # the hover names it
    par = tables.pareto(agg)
    front = par[par["on_frontier"] & (par["platform"] == H200)]
    assert set(front["input_mode"]) == {"", "int8-resident"}  # each input its own frontier


def test_show_and_export_label_it(store, tmp_path):
    out = deepgap_cli("show", store, "--all")
    assert out.returncode == 0, out.stderr
    assert "quant · int8-resident" in out.stdout and "int8 images resident in GPU memory" in out.stdout
    assert (
        all(c in out.stdout for c in MLPERF_CONDITIONS[:3])
        and "no MLPerf anchor for Fixture GPU A" in out.stdout
    )
    exported = deepgap_cli("export", store, "-o", "-")
    assert exported.returncode == 0, exported.stderr
    frame = pd.read_csv(io.StringIO(exported.stdout), keep_default_na=False)
    assert sorted(set(frame["input_mode"])) == ["", "int8-resident"]
    assert (frame["input_mode"] == "int8-resident").sum() == 4  # two sweeps on two platforms
    records = json.loads(deepgap_cli("show", store, "--all", "--json").stdout)
    assert {r["input_mode"] for r in records} == {"", "int8-resident"}


def test_compare_labels_it_and_carries_mlperfs_conditions(store):
    out = deepgap_cli("compare", store, "--platforms", f"{H200},{OTHER}", "--best-only")
    assert out.returncode == 0, out.stderr
    assert "quant · int8-resident" in out.stdout
    text = " ".join(out.stdout.split())  # the console wraps long lines
    assert all(c in text for c in MLPERF_CONDITIONS) and "no MLPerf anchor for Fixture GPU A" in text
    js = json.loads(deepgap_cli("compare", store, "--platforms", f"{H200},{OTHER}", "--json").stdout)
    modes = {(r["engine"], r["input_mode"]) for r in js["best_batch"]}
    assert ("quant", "int8-resident") in modes and ("quant", "") in modes  # paired like with like only
    assert any("95,089 img/s" in line and "batch 2048" in line for line in js["resident_inputs"])
