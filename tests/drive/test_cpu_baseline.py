"""The host CPU measured in the default GPU run (issue 41, docs/cpu-baseline.md).

The plan on a machine with a (fake) GPU, ``--no-cpu-baseline``, the resume key, the run's sequencing with a
fake GPU runner and an in-process CPU worker, like-with-like ratios on synthetic frames, the answer's
"× host CPU" line and ``compare --paper`` on a synthetic two-device store. No CUDA needed.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pandas as pd
import pytest
from clirun import deepgap_cli
from fixtures_store import make_result

from deepgap import api
from deepgap.analysis import aggregate, prepare, tables
from deepgap.analysis.reference import paper_peaks
from deepgap.commands import run as run_cmd
from deepgap.core.errors import UsageError
from deepgap.core.records import ConfigSpec
from deepgap.drive import sweep
from deepgap.drive.config import SweepSpec, validate
from deepgap.drive.launcher import Finished
from deepgap.drive.plan import expand
from deepgap.drive.runner import SweepRunner
from deepgap.store import Store


def _spec(monkeypatch, *argv: str, gpu: bool = True, cores: int = 16) -> SweepSpec:
    """``deepgap run ARGV``'s spec on a host whose device probe says ``gpu`` and that has ``cores`` cores."""
    monkeypatch.setattr(api, "gpu_present", lambda: gpu)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    return validate(run_cmd.build_spec(p.parse_args(list(argv))))


def test_the_default_plan_on_a_gpu_machine_ends_with_the_host_cpu(monkeypatch):
    spec = _spec(monkeypatch)
    rows = expand(spec, "cuda")
    cpu = [c for c in rows if c.device == "cpu"]
    assert spec.cpu_baseline and spec.cpu_cores == 16
    assert rows[-len(cpu) :] == cpu and len(rows) - len(cpu) == 56  # after the GPU's whole grid (28 × 2)
    all_cores = {
        (c.model, c.batch_size) for c in cpu if (c.engine, c.precision, c.threads) == ("eager", "fp32", 16)
    }
    assert all_cores == {(m, b) for m in ("resnet18", "resnet50", "resnet101") for b in (1, 8)}
    int8 = {(c.model, c.batch_size) for c in cpu if (c.engine, c.precision) == ("onnxruntime", "int8")}
    assert int8 == all_cores
    scaling = sorted(
        c.threads for c in cpu if c.model == "resnet50" and c.batch_size == 1 and c.engine == "eager"
    )
    assert scaling == [1, 2, 4, 8, 16] and len(set(cpu)) == len(cpu) == 16
    # the resume key is exact: the stored spec plans the same keys on a host that now reports other cores
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    again = validate(SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))))
    assert [c.key for c in expand(again, "cuda")] == [c.key for c in rows]


def test_a_text_models_host_cpu_rows_are_text_rows_at_the_shortest_sequence(monkeypatch):
    """Its rows carry ``seq_len`` (seq/s and tokens/s in every view, ratios like with like), at the sweep's
    shortest length; before, they were planned as image rows of 128 "px"."""
    spec = _spec(monkeypatch, "--models", "bert-base,resnet50", "--seq-lens", "384,128", "--batch-sizes", "8")
    cpu = [c for c in expand(spec, "cuda") if c.device == "cpu"]
    assert {(c.seq_len, c.resolution) for c in cpu if c.model == "bert-base"} == {(128, 128)}
    assert {(c.seq_len, c.resolution) for c in cpu if c.model == "resnet50"} == {(None, 224)}


def test_no_cpu_baseline_and_device_cpu_plan_no_host_cpu_part(monkeypatch):
    assert not [c for c in expand(_spec(monkeypatch, "--no-cpu-baseline"), "cuda") if c.device == "cpu"]
    cpu_run = _spec(monkeypatch, "--device", "cpu", gpu=True, cores=4)  # --device cpu alone stays as it was
    assert not cpu_run.cpu_baseline and cpu_run.threads == (1, 2, 4)
    assert {c.device for c in expand(cpu_run, "cpu")} == {"cpu"} and len(expand(cpu_run, "cpu")) == 24
    assert not SweepSpec().cpu_baseline  # the tests' tiny specs and the presets other than gpu: unchanged
    with pytest.raises(UsageError, match="cpu_baseline.? must be true or false"):
        validate(SweepSpec.from_dict({"cpu_baseline": "yes"}))


class _FakeGpuRunner(SweepRunner):
    """The GPU side without a GPU: each configuration comes back measured at a made-up latency."""

    log: list[str] = []

    def start(self):
        self.log.append("gpu start")

    def environment(self):
        return {"device_name": "Fake GPU", "device": "cuda", "host": "h"}

    def results(self, configs):
        for c in configs:
            self.log.append(f"gpu {c.label()}")
            yield Finished("", make_result(c, 0.001))

    def close(self):
        self.log.append("gpu closed")


def test_the_run_measures_the_gpu_then_its_host_cpu_into_one_run(monkeypatch, tmp_path):
    """End to end without CUDA: a fake GPU runner, then the real CPU handlers in process (tinycnn)."""
    from deepgap.drive.inprocess import InProcessWorker

    def runner(spec, device):
        if device != "cpu":
            return _FakeGpuRunner(spec, device)
        r = SweepRunner(spec, device, worker=InProcessWorker("cpu"))
        _FakeGpuRunner.log.append(f"cpu runner {spec.warmup}/{spec.iterations}x{spec.repeats}")
        return r

    monkeypatch.setattr(sweep, "SweepRunner", runner)
    monkeypatch.setattr(sweep, "resolve_device", lambda d: "cuda")
    monkeypatch.setattr(
        "deepgap.drive.plan.CPU_BASELINE_INT8_ENGINE", "eager"
    )  # no ONNX export in a unit test
    _FakeGpuRunner.log = []
    spec = SweepSpec(
        models=("tinycnn",),
        device="cuda",
        batch_sizes=(1,),
        telemetry=False,
        warmup=1,
        iterations=2,
        repeats=1,
        cpu_baseline=True,
        cpu_cores=2,
    )
    monkeypatch.setattr("deepgap.drive.presets.CPU_BASELINE_BATCHES", (1,))
    fixed = (
        sweep.cpu_baseline_spec
    )  # its protocol, at a fixed count (no adaptive repeats on a loaded test host)
    monkeypatch.setattr(sweep, "cpu_baseline_spec", lambda s, n: fixed(s, n).replace(target_ci=None))
    events = []
    store = str(tmp_path / "s.sqlite")
    res = api.run(spec, store=store, on_event=lambda e: events.append((e.index, e.total, e.result is None)))
    log = _FakeGpuRunner.log
    assert log[:2] == ["gpu start", "gpu tinycnn eager fp32 bs1"]
    assert log.index("gpu closed") < log.index(
        "cpu runner 2/4x2"
    )  # the GPU is idle while the CPU is measured
    s = Store(store, readonly=True)
    try:
        df = s.results_frame()
    finally:
        s.close()
    assert set(df["run_id"]) == {res.run_id}
    assert list(df["status"]) == ["ok", "ok", "ok", "skipped"]  # "int8" through eager here: a stored skip
    gpu, cpu = df[df["device"] == "cuda"], df[df["device"] == "cpu"]
    assert list(gpu["device_name"]) == ["Fake GPU"]  # the run's device
    assert len(cpu) == 3 and set(cpu["device_name"]) - {"Fake GPU", ""}  # the second device, by its own name
    assert sorted(cpu["threads"]) == [1, 2, 2]  # bs1 with all (2) cores, thread scaling 1 and 2
    assert [e[:2] for e in events if not e[2]] == [(0, 4), (1, 4), (2, 4), (3, 4)]  # one progress count


def _agg(rows: list[dict]) -> pd.DataFrame:
    base = {
        "engine": "eager",
        "memory_format": "nchw",
        "threads": 0,
        "resolution": 224,
        "include_transfer": False,
        "flagged": False,
        "flags": [],
        "warnings": [],
        "n_measurements": 1,
        "n_runs": 1,
        "n_excluded": 0,
        "ci_method": "x",
        "throughput_pipelined_ips": np.nan,
        "latency_median_s": np.nan,
        "latency_p99_s": np.nan,
        "flops_per_image": np.nan,
    }
    out = []
    for r in rows:
        r = {**base, **r}
        tp = r["throughput_ips"]
        r.setdefault("throughput_ci_low_ips", 0.9 * tp)
        r.setdefault("throughput_ci_high_ips", 1.1 * tp)
        out.append(r)
    return pd.DataFrame(out)


def test_each_gpu_row_is_divided_by_its_host_cpu_like_with_like():
    g = {"platform": "G", "device": "cuda", "model": "resnet50", "batch_size": 256, "run_ids": ["r1"]}
    c = {
        "platform": "Host CPU",
        "device": "cpu",
        "model": "resnet50",
        "batch_size": 8,
        "threads": 16,
        "run_ids": ["r1"],
    }
    agg = _agg(
        [
            {**g, "precision": "fp32", "throughput_ips": 3000.0},
            {**g, "precision": "fp16", "throughput_ips": 9000.0},
            {**g, "precision": "int8", "engine": "quant", "throughput_ips": 30000.0},
            {**c, "precision": "fp32", "throughput_ips": 100.0},
            {**c, "precision": "int8", "engine": "onnxruntime", "throughput_ips": 400.0},
            # another machine's CPU, faster: never this GPU's baseline while its own run has a CPU
            {**c, "platform": "Other CPU", "run_ids": ["r2"], "precision": "fp32", "throughput_ips": 1000.0},
        ]
    )
    t1 = {(r["platform"], r["precision"]): r for r in tables.table1(agg).to_dict("records")}
    i8 = t1[("G", "int8")]
    assert i8["speedup_vs_cpu"] == pytest.approx(75.0)  # int8 over the CPU's int8, not its fp32 (300×)
    assert (i8["speedup_vs_cpu_ci_low"], i8["speedup_vs_cpu_ci_high"]) == (
        pytest.approx(30000 * 0.9 / (400 * 1.1)),
        pytest.approx(30000 * 1.1 / (400 * 0.9)),
    )
    assert (
        "onnxruntime int8 bs8 16 threads" in i8["cpu_baseline"]
        and "like with like (int8)" in i8["cpu_baseline"]
    )
    assert t1[("G", "fp32")]["speedup_vs_cpu"] == pytest.approx(30.0)
    fp16 = t1[("G", "fp16")]
    # no 16-bit on the CPU: its best (int8, 400/s), labelled best vs best (issue 49), not its fp32
    assert fp16["speedup_vs_cpu"] == pytest.approx(22.5) and "measured no fp16" in fp16["cpu_baseline"]
    assert "best vs best" in fp16["cpu_baseline"]
    sp = tables.speedup_vs_cpu(agg).set_index("precision")
    assert sp.loc["int8", "speedup_vs_cpu"] == pytest.approx(75.0)
    assert sp.loc["int8", "cpu_match"].startswith("like with like (int8), its run's host CPU")
    assert sp.loc["fp32", "speedup_vs_cpu_ci_low"] < 30.0 < sp.loc["fp32", "speedup_vs_cpu_ci_high"]


def _two_device_store(path: str, rapl: bool) -> str:
    """One run: a GPU (resnet50 fp32/int8) and its host CPU (fp32 threads 4/1, int8), like a default run."""
    s = Store(path)
    try:
        run = s.begin_run(
            {"device": "cuda", "cpu_baseline": True},
            "deepgap run",
            {"device_name": "Fixture GPU", "device": "cuda"},
            "0.1.0",
        )
        gpu_ms = {
            ("eager", "fp32", 1): 2.0,
            ("eager", "fp32", 256): 100.0,
            ("quant", "int8", 1): 1.0,
            ("quant", "int8", 256): 20.0,
        }
        for (eng, prec, bs), ms in gpu_ms.items():
            spec = ConfigSpec(model="resnet50", engine=eng, precision=prec, batch_size=bs, device="cuda")
            tel = {"telemetry": {"joules_per_image": 0.5 if prec == "fp32" else 0.1}}
            s.record(run, make_result(spec, ms / 1e3, extra=tel))
        cpu_ms = {
            ("eager", "fp32", 1, 4): 20.0,
            ("eager", "fp32", 8, 4): 100.0,
            ("eager", "fp32", 1, 1): 60.0,
            ("onnxruntime", "int8", 1, 4): 8.0,
            ("onnxruntime", "int8", 8, 4): 40.0,
        }
        for (eng, prec, bs, t), ms in cpu_ms.items():
            spec = ConfigSpec(
                model="resnet50", engine=eng, precision=prec, batch_size=bs, device="cpu", threads=t
            )
            tel = (
                {"joules_per_image": (2.0 if prec == "fp32" else 1.0) / (1 + (bs > 1))}
                if rapl
                else {
                    "energy_source": "unavailable: /sys/class/powercap/intel-rapl:0/energy_uj is not "
                    "readable (RAPL is root-only since Linux 5.10)"
                }
            )
            extra = {"telemetry": tel, "node_env": {"device_name": "Fixture Host CPU", "device": "cpu"}}
            s.record(run, make_result(spec, ms / 1e3, extra=extra))
        s.finish_run(run)
    finally:
        s.close()
    return path


@pytest.mark.parametrize("rapl", [True, False])
def test_the_answer_has_a_host_cpu_line_per_gpu_model(tmp_path, rapl):
    from deepgap.report.answer import HOST_CPU_GOAL, answers

    path = _two_device_store(str(tmp_path / "two.sqlite"), rapl)
    s = Store(path, readonly=True)
    try:
        df = prepare(s.results_frame())
    finally:
        s.close()
    agg = aggregate(df)
    assert set(agg["platform"]) == {"Fixture GPU", "Fixture Host CPU"}
    # one run fills Table I's × CPU (with its interval), the speedup figure's rows and the thread scaling
    t1 = tables.table1(agg)
    gpu = t1[t1["platform"] == "Fixture GPU"]
    assert (
        len(gpu) == 2 and gpu["speedup_vs_cpu"].notna().all() and gpu["speedup_vs_cpu_ci_low"].notna().all()
    )
    assert len(tables.speedup_vs_cpu(agg)) == 2
    assert sorted(tables.thread_scaling(agg)["threads"]) == [1, 4]
    rows, _ = answers(agg, df)
    line = rows[rows["goal"] == HOST_CPU_GOAL]
    assert list(line["platform"]) == ["Fixture GPU"]  # one line per GPU model; none for the CPU itself
    r = line.iloc[0]
    # like with like: quant int8 bs256 (12,800/s) over onnxruntime int8 bs8 (200/s); bs1: 1 ms vs 8 ms
    assert r["value"] == "64.0×" and r["ci"].startswith("[") and r["answered"]
    assert r["configuration"] == "quant int8 bs256"
    assert r["n"] == "like with like: vs onnxruntime int8 bs8 4 thr on Fixture Host CPU"
    detail = r["host_cpu_detail"]  # answer.csv: every ratio with its interval and both configurations
    assert "bs1 latency 8.00× [" in detail and "(quant int8 bs1 ÷ onnxruntime int8 bs1 4 thr)" in detail
    if rapl:  # 0.5 J over 0.1 J
        assert r["also"] == "bs1 latency 8.00× · J/img 5.00×"
        assert "J/image 5.00× (quant int8 bs256 ÷ onnxruntime int8 bs8 4 thr)" in detail
    else:
        assert r["also"] == "bs1 latency 8.00× · J/img: no CPU energy (RAPL unreadable)"
        assert "J/image: CPU energy unavailable: /sys/class/powercap" in detail and "root-only" in detail


def test_compare_paper_sets_your_gpu_cpu_ratio_beside_the_papers(tmp_path):
    path = _two_device_store(str(tmp_path / "two.sqlite"), rapl=False)
    out = deepgap_cli("compare", path, "--paper", "--json")
    assert out.returncode == 0, out.stderr
    x = pd.DataFrame(json.loads(out.stdout)["x_cpu"])
    paper = paper_peaks().set_index(["platform", "model", "precision"])["speedup_vs_cpu"]
    r = x[(x["precision"] == "int8") & (x["paper_platform"] == "NVIDIA L4")].iloc[0]
    assert r["paper_x_cpu"] == pytest.approx(
        paper[("NVIDIA L4", "resnet50", "int8")]
    )  # 58.21, over Xeon fp32
    assert r["yours_x_cpu_fp32"] == pytest.approx(12800 / 80)  # as the paper: over the CPU's fp32 (bs8: 80/s)
    assert r["yours_x_cpu_same"] == pytest.approx(12800 / 200)  # like with like: the CPU's int8
    assert r["yours_over_paper"] == pytest.approx(160 / 58.21)
    assert set(x["paper_platform"]) == {"NVIDIA T4", "NVIDIA L4"} and set(x["precision"]) == {"fp32", "int8"}
    text = deepgap_cli("compare", path, "--paper")
    assert text.returncode == 0 and "GPU over CPU beside the paper's" in text.stdout


def test_the_gpu_thermal_timeline_leaves_out_the_host_cpu_samples():
    from deepgap.report.core import gpu_part

    tel = pd.DataFrame(
        {
            "result_id": [1, 2, np.nan],
            "phase": ["measure", "measure", "thermal"],
            "temp_c": [70.0, 45.0, 60.0],
        }
    )
    df = pd.DataFrame({"run_id": ["r", "r"], "result_id": [1, 2], "device": ["cuda", "cpu"]})
    assert list(gpu_part(tel, df, {"run_id": "r", "env": {"device": "cuda"}})["temp_c"]) == [70.0, 60.0]
    assert len(gpu_part(tel, df, {"run_id": "r", "env": {"device": "cpu"}})) == 3  # a CPU run keeps its own
