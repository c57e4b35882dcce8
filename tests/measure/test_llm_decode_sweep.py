"""The ``decode`` workload of a sweep (issue 51, item 2): validation, plan, keys, the worker's figures,
the store's split of decode rows from forward rows, ``show`` and ``export``, and the view's roofline bound.

One CLI run of llama-tiny measured in this process (`conftest.inprocess_worker`): tiny lengths, few tokens.
The compile and CUDA-graph steps are GPU tests (`pytest -m gpu tests/measure/test_llm_decode_sweep.py`).
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from fixtures_decode import DECODE

from deepgap.cli import main
from deepgap.core.records import ConfigSpec
from deepgap.core.result_details import Decode, ResultDetails
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.plan import expand


def test_plan_keys_and_labels():
    plan = expand(validate(SweepSpec(**DECODE)), "cpu")
    assert [(c.input_len, c.output_len, c.batch_size) for c in plan] == [
        (8, 5, 1),
        (8, 5, 3),
        (12, 5, 1),
        (12, 5, 3),
    ]
    c = plan[0]
    assert c.is_decode and c.seq_len is None and c.resolution == 8
    assert ConfigSpec.from_key(c.key) == c and ConfigSpec.decode_lens_of(c.key) == (8, 5)
    assert "decode 8/5" in c.label()
    assert len({p.group for p in plan}) == 2  # an OOM at one length skips only its larger batches
    forward = ConfigSpec("llama-tiny", "eager", "fp32", 1, "cpu", resolution=8, seq_len=8)
    assert "input_len" not in forward.key and ConfigSpec.decode_lens_of(forward.key) is None
    gpu = SweepSpec(**{**DECODE, "device": "cuda", "cpu_baseline": False})
    assert all(c.is_decode for c in expand(validate(gpu), "cuda"))


def test_toml_and_flag_defaults(tmp_path):
    import argparse

    from deepgap.commands.run import add_arguments, build_spec
    from deepgap.drive.presets import load_toml

    toml = tmp_path / "d.toml"
    toml.write_text('models = ["llama-tiny"]\nworkload = "decode"\ninput_lens = [16]\noutput_lens = [4, 8]\n')
    spec = load_toml(str(toml))
    assert (spec.workload, spec.input_lens, spec.output_lens) == ("decode", (16,), (4, 8))
    p = argparse.ArgumentParser()
    add_arguments(p)
    spec = build_spec(p.parse_args(["--workload", "decode", "--models", "llama-tiny", "--device", "cuda"]))
    # the forward grid's engines do not decode: eager, bf16, batches 1 and 8; the host CPU's decode after it
    assert (spec.engines, spec.precisions, spec.batch_sizes, spec.cpu_baseline) == (
        ("eager",),
        ("bf16",),
        (1, 8),
        True,
    )
    validate(spec)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "tinybert"], "needs a decoder model, and 'tinybert' is not one"),
        (["--models", "llama-tiny", "--input-lens", "500", "--output-lens", "100"], "context of 512"),
        (["--models", "llama-tiny", "--output-lens", "0"], "output_lens has 0"),
        (["--models", "llama-tiny", "--output-lens", "1"], "no decode step"),
        (["--models", "llama-tiny", "--batch-sizes", "100000"], "out of range"),
        (["--models", "llama-tiny", "--engines", "tensorrt"], "has no decode step"),
        (["--models", "llama-tiny", "--precisions", "int8"], "(fp8/int8 weights: --engines quant)"),
        (["--models", "llama-tiny", "--engines", "quant", "--precisions", "bf16"], "runs fp8, int8"),
        (["--models", "llama-tiny", "--seq-lens", "16"], "--seq-lens does not apply"),
        (["--models", "llama-tiny", "--workload", "decoder"], "unknown workload 'decoder'"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, says):
    store = tmp_path / "s.sqlite"
    argv = ["run", "--workload", "decode", *args, "--device", "cpu", "--store", str(store), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_decode_axes_without_decode_are_refused(tmp_path, capsys):
    argv = ["run", "--models", "llama-tiny", "--input-lens", "8", "--device", "cpu"]
    assert main([*argv, "--store", str(tmp_path / "s.sqlite")]) == 2
    assert "add --workload decode" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One CLI decode run of llama-tiny in this process: fp32 and bf16 eager, cudagraph (skipped on a CPU),
    two sweeps (the interval across processes)."""
    from conftest import inprocess_worker

    path = str(tmp_path_factory.mktemp("decode") / "s.sqlite")
    argv = [
        *("run", "--workload", "decode", "--models", "llama-tiny", "--device", "cpu", "--threads", "1"),
        *("--engines", "eager,cudagraph", "--precisions", "fp32,bf16", "--batch-sizes", "2"),
        *("--input-lens", "8", "--output-lens", "6", "--repeats", "2", "--warmup", "0", "--sweeps", "2"),
        *("--store", path, "--no-telemetry", "--idle-time", "0", "--quiet"),
    ]
    with pytest.MonkeyPatch.context() as mp, inprocess_worker(mp):
        assert main(argv) == 0
    return path


def _frames(path):
    from deepgap.store import Store

    s = Store(path, readonly=True)
    try:
        return s.results_frame(), s.decode_frame(), s.samples
    finally:
        s.close()


def test_worker_stores_the_figures(store):
    from deepgap.store import Store

    forward, dec, _ = _frames(store)
    assert forward.empty  # no forward view ever pools a decode row's TPOT with a forward latency
    assert sorted(zip(dec["engine"], dec["precision"], dec["status"], dec["sweep"], strict=True)) == [
        (e, p, "skipped" if e == "cudagraph" else "ok", sweep)
        for e in ("cudagraph", "eager")
        for p in ("bf16", "fp32")
        for sweep in (0, 1)
    ]
    assert set(dec["reason"][dec["status"] == "skipped"]) == {"cudagraph decode needs a CUDA device"}
    ok = dec[dec["status"] == "ok"]
    for row in ok.to_dict("records"):
        d = row["extra"].decode
        assert (d.input_len, d.output_len, d.runs, d.warmup_runs, d.step) == (8, 6, 2, 0, "eager")
        assert d.angles == "formula"  # a CPU row's RoPE angles: torch's (the one kernel is a GPU's)
        assert d.ttft_n == 2 and d.tpot_n == 2 * 5 and d.tpot_tail_kind == "max"  # 10 < 368: no p99
        assert row["n_samples"] == 10 and row["latency_median_s"] == pytest.approx(d.tpot_median_s)
        assert row["throughput_ips"] == pytest.approx(2 / d.tpot_median_s)  # batch / median TPOT
        assert d.output_tok_s == pytest.approx(2 * 6 / d.e2e_median_s, rel=0.5)
        assert d.kv_cache_bytes == 2 * 14 * 2 * 2 * 2 * 16 * (4 if row["precision"] == "fp32" else 2)
        assert d.weight_bytes == 106_816 * (4 if row["precision"] == "fp32" else 2)
        assert d.bytes_per_token > 0 and row["flops_per_image"] == d.flops_per_token > 0
        assert d.tokens_checked == 2 * 6 and d.joules_per_token is None  # no telemetry: no energy
    fp32 = ok[ok["precision"] == "fp32"].iloc[0]
    c, d = fp32["extra"].correctness, fp32["extra"].decode
    assert c.rel_l2 == 0 and d.token_agreement == 1 and d.first_mismatch is None  # fp32 is its reference
    bf16 = ok[ok["precision"] == "bf16"].iloc[0]["extra"].correctness
    assert 0 < bf16.rel_l2 < bf16.bound_rel_l2 and not bf16.flagged
    s = Store(store, readonly=True)
    try:
        rid = int(ok["result_id"].iloc[0])
        assert [len(x) for x in s.samples(rid)] == [5, 5]  # per generation, every decode step
    finally:
        s.close()


def test_show_and_export_name_their_units(store, tmp_path, capsys):
    assert main(["show", store]) == 0
    out = capsys.readouterr().out
    for text in ("TTFT ms", "TPOT ms/token", "decode tokens/s", "output tokens/s", "J/token", "max of n=10"):
        assert text in out, text
    assert "img/s" not in out and "no energy" in out
    # two sweeps: the interval across processes, and the pooled tail (2 × 10 samples: still a maximum)
    assert "decode measured in several sweeps" in out and "bs2 8/6 ×2" in out and "max of n=20" in out
    csv = tmp_path / "d.csv"
    assert main(["export", store, "-o", str(csv)]) == 0
    df = pd.read_csv(csv)
    assert set(df["workload"]) == {"decode"} and "throughput_ips" not in df
    ok = df[df["status"] == "ok"]
    assert (ok["tpot_tail_label"] == "max of n=10").all() and (ok["ttft_n"] == 2).all()
    assert (ok["decode_tokens_per_s"] > 0).all() and ok["bound_tokens_per_s"].isna().all()  # a CPU: no bound
    samples = tmp_path / "samples.csv"
    assert main(["export", store, "-o", str(samples), "--samples"]) == 0
    long = pd.read_csv(samples)
    assert len(long) == 4 * 10 and long["config_key"].str.contains('"output_len":6').all()  # 4 ok rows
    capsys.readouterr()
    assert main(["show", store, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["workload"] for r in rows} == {"decode"} and len(rows) == 8


def test_report_section_reads_the_decode_rows(store):
    """The report's decode section (its table, no page build): every row's cells render."""
    from deepgap.analysis import decode_section
    from deepgap.render.sections import ReportContext

    ctx = ReportContext(store, None, False, [], pd.DataFrame(), pd.DataFrame())
    tab = decode_section.build(ctx).tables["decode"]
    assert len(tab) == 8
    title, cols = decode_section.TABLE_SPECS["decode"]
    cells = [[c(r) if callable(c) else r[c] for _, c in cols] for r in tab.to_dict("records")]
    heads = [h for h, _ in cols]
    ok = [dict(zip(heads, row, strict=True)) for row in cells if row[heads.index("status")] == "ok"]
    assert "TPOT ms/token" in heads[9] and all("max of n=10" in r["TPOT tail ms"] for r in ok)
    assert all(r["share of the bound"] == "–" for r in ok)  # a CPU: no bandwidth bound


def test_view_bound_from_the_datasheet_bandwidth():
    from deepgap.analysis.decode import decode_table, tail_label

    d = Decode(tpot_n=400, tpot_tail_kind="p99", bytes_per_token=2.4e9, tpot_median_s=1e-3)
    row = {
        "status": "ok",
        "device": "cuda:0",
        "device_name": "NVIDIA H200",
        "throughput_ips": 960.0,
        "extra": ResultDetails(decode=d),
        "config_key": "{}",
    }
    tab = decode_table(pd.DataFrame([row]))
    r = tab.iloc[0]
    assert r["bound_tokens_per_s"] == pytest.approx(4800e9 / 2.4e9)  # 2,000 tokens/s at 4.8 TB/s
    assert r["fraction_of_bound"] == pytest.approx(0.48) and "4,800 GB/s" in r["bound_source"]
    assert (
        tail_label(d) == "p99 of n=400"
        and tail_label(Decode(tpot_n=20, tpot_tail_kind="max")) == "max of n=20"
    )
    cpu = decode_table(pd.DataFrame([{**row, "device": "cpu", "device_name": "AMD EPYC"}])).iloc[0]
    assert math.isnan(cpu["bound_tokens_per_s"]) and cpu["bound_source"] == ""


def test_energy_per_token_and_the_linear_swap_hook(monkeypatch):
    """J/token is the pipelined decode windows' energy over their tokens; `LINEAR_SWAPS` replaces the cast."""
    import torch

    from deepgap.measure import decode_config
    from deepgap.measure.telemetry.settings import TelemetrySettings

    swapped = []

    def swap(model):  # what measure/quant's fp8/int8 Linear path plugs in; here a plain cast, recorded
        swapped.append(type(model).__name__)
        return model.to(torch.bfloat16)

    monkeypatch.setitem(decode_config.LINEAR_SWAPS, "fp16", swap)
    tel = TelemetrySettings(backend="fake:steady", sample_hz=50, align_timeout_s=0.01)
    r = _measured_in_process("fp16", 6, tel)
    assert r.status.value == "ok", r.reason
    t, d = r.details.telemetry, r.details.decode
    assert t.get("images") == 2 * 5 * 2  # generations × decode steps × batch: the windows' tokens
    assert d.joules_per_token == t.joules_per_image == pytest.approx(t.energy_j / 20)
    assert swapped == ["Llama"] and d.weight_bytes == 106_816 * 2  # bf16 from the swap, not fp16's cast


GPU = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("engine", ["cudagraph", "compile", "compile-reduce-overhead"])
def test_gpu_steps_agree_with_fp32(engine):
    """The compiled and graph steps decode the fp32 reference's tokens (bf16 within its logits bound)."""
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.runner import protocol_for
    from deepgap.measure.protocol import MeasureRequest

    spec = validate(SweepSpec(**{**DECODE, "device": "cuda", "engines": (engine,), "cpu_baseline": False}))
    w = InProcessWorker("cuda")
    w.start()
    try:
        for precision in ("fp32", "bf16"):
            c = ConfigSpec(
                "llama-tiny", engine, precision, 4, "cuda", resolution=16, input_len=16, output_len=32
            )
            res = w.call("measure", MeasureRequest(spec=c, protocol=protocol_for(spec)), 300)
            assert res.status.value == "ok", res.reason
            d = res.details.decode
            assert d.step != "eager" and not res.details.correctness.flagged
            if precision == "fp32":  # a graph replaying the wrong cache or position agrees on ~1/vocab
                assert d.token_agreement >= 0.9, d  # the masked static step may flip a rare near-tie
    finally:
        w.stop()


def _measured_in_process(precision: str, output_len: int, tel):
    """llama-tiny at batch 2, 8 in / ``output_len`` out, measured by an in-process worker under ``tel``."""
    import torch

    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.measure.protocol import MeasureRequest
    from deepgap.measure.timing import TimingProtocol

    threads = torch.get_num_threads()
    w = InProcessWorker("cpu")
    w.start()
    try:
        c = ConfigSpec(
            "llama-tiny",
            "eager",
            precision,
            2,
            "cpu",
            threads=1,
            resolution=8,
            input_len=8,
            output_len=output_len,
        )
        return w.call("measure", MeasureRequest(spec=c, protocol=TimingProtocol(0, 1, 2), telemetry=tel), 120)
    finally:
        w.stop()
        torch.set_num_threads(threads)


def test_a_decode_thermal_warmup_builds_no_reference(monkeypatch):
    """The warm-up stores no figure: no fp32 decoder (32 GB on the device for the 8B shape) and no check."""
    from fixtures_thermal import THERMAL, refuse

    from deepgap.measure import decode_config

    refuse(monkeypatch, decode_config, "_reference", "_check")
    r = _measured_in_process("fp32", 4, THERMAL)
    assert r.status.value == "ok", r.reason
    assert r.details.thermal["stopped_by"] == "steady"
