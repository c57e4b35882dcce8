"""Decode's roofline, the host CPU beside the GPU, the answer for decoders and ``plan --target-tok-s``
(issue 51, items 3, 5 and 6), from a hand-built store (`fixtures_decode`): no measurement.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from fixtures_decode import CPU, GPU, ROWS, output_tok_s, write_decode_store

from deepgap.cli import main
from deepgap.measure.llm_cost import Itemsizes, decode_cost
from deepgap.measure.models.llama_config import SHAPES

# Llama-3.1-8B by hand: GEMM weights (projections, MLP, head) and the rest a decode step reads at batch 1
H, L, V = 4096, 32, 128_256
GEMM = L * (2 * H * H + 2 * H * 1024 + 3 * H * 14_336) + V * H
REST = L * 2 * H + H + H  # the norms, the final norm, one embedding row
KV_PER_TOKEN_BF16 = 2 * L * 8 * 128 * 2


def test_weights_at_their_precision_and_the_kv_at_the_mean_context():
    ctx = 128 + (128 - 2) / 2
    fp8 = decode_cost(SHAPES["llama-3.1-8b"], 1, ctx, Itemsizes(linear=1, other=2, kv=2))
    assert fp8.weight_bytes == GEMM * 1 + REST * 2  # fp8 Linears 1 byte, the rest bf16
    assert fp8.kv_bytes == pytest.approx((ctx + 1) * KV_PER_TOKEN_BF16)
    bf16 = decode_cost(SHAPES["llama-3.1-8b"], 1, ctx)
    assert bf16.weight_bytes == (GEMM + REST) * 2
    attention = 4 * L * 32 * 128 * (ctx + 1)
    assert fp8.flops_per_token == pytest.approx(2 * GEMM + attention)
    # issue 51's anchor: ≈ 640 tokens/s for the 8B model in fp8 at 4.8 TB/s
    assert 4800e9 / fp8.bytes_per_token == pytest.approx(
        4800e9 / (GEMM + 2 * REST + (ctx + 1) * KV_PER_TOKEN_BF16)
    )
    assert 600 < 4800e9 / fp8.bytes_per_token < 660


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dec") / "s.sqlite")
    write_decode_store(path)
    return path


@pytest.fixture(scope="module")
def tab(store):
    from deepgap.analysis.decode_section import read_table

    return read_table(store, None)


def _row(tab, model, precision, bs):
    hit = tab[(tab["model"] == model) & (tab["precision"] == precision) & (tab["batch_size"] == bs)]
    return hit.iloc[0].to_dict()


def test_distance_from_the_memory_bound_names_both_sides(tab):
    from deepgap.analysis.decode_roofline import distance_text

    r = _row(tab, "llama-3.1-8b", "fp8", 1)
    cost = decode_cost(SHAPES["llama-3.1-8b"], 1, 128 + 63, Itemsizes(linear=1, other=2, kv=2))
    bound = 4800e9 / cost.bytes_per_token
    assert r["bound_tokens_per_s"] == pytest.approx(bound)
    assert r["decode_tokens_per_s"] == pytest.approx(1 / 2.1e-3)
    text = distance_text(r)
    want = f"batch 1: decode {1 / 2.1e-3:,.1f} tokens/s = {1 / 2.1e-3 / bound:.2f}× the memory bound of {bound:,.0f}"
    assert text.startswith(want), text
    assert "datasheet 4,800 GB/s" in text and "compute bound" in text
    assert r["bound_limiter"] == "memory"
    cpu = _row(tab, "llama-3.2-1b", "fp32", 1)
    assert math.isnan(cpu["bound_tokens_per_s"]) and "no memory bound" in distance_text(cpu)


def test_a_measured_bandwidth_wins_over_the_sheet(store):
    from deepgap.analysis.decode import decode_table
    from deepgap.store import Store

    peaks = pd.DataFrame(
        {
            "name": ["memory", "bf16"],
            "value": [4000.0, 700.0],
            "status": ["ok", "ok"],
            "device_name": [GPU, GPU],
            "created_at": [1.0, 1.0],
        }
    )
    s = Store(store, readonly=True)
    try:
        frame = s.decode_frame()
    finally:
        s.close()
    tab = decode_table(frame, peaks)
    r = _row(tab, "llama-3.1-8b", "bf16", 1)
    assert r["bound_tokens_per_s"] == pytest.approx(4000e9 / r["bytes_per_token"])
    other = decode_table(frame, peaks.assign(device_name="NVIDIA H100 (fixture)"))  # another GPU's: the sheet
    assert "datasheet 4,800 GB/s" in _row(other, "llama-3.1-8b", "bf16", 1)["bound_source"]
    assert math.isnan(_row(tab, "llama-3.2-1b", "fp32", 1)["bound_tokens_per_s"])  # never on the CPU
    assert "measured (deepgap peaks) 4,000 GB/s" in r["bound_source"]
    assert r["compute_bound_tokens_per_s"] == pytest.approx(700e12 / r["flops_per_token"])


def test_the_answer_per_device_and_model(tab):
    from deepgap.analysis.decode_answer import decode_answers

    answers = {(a.platform, a.model): a for a in decode_answers(tab)}
    big = answers[(GPU, "llama-3.1-8b")]
    pick = {g: (r["engine"], r["precision"], int(r["batch_size"])) for g, r in big.choice.items()}
    # the flagged fp8 batch 64 is fastest and cheapest in energy, and is never the answer
    assert pick == {
        "throughput": ("eager", "bf16", 8),
        "tpot": ("quant", "fp8", 1),
        "joules": ("eager", "bf16", 8),
    }
    assert sum(big.excluded.values()) == 1 and big.considered == 3
    cpu = answers[(CPU, "llama-3.2-1b")]
    assert (cpu.input_len, cpu.output_len) == (64, 16) and int(cpu.choice["tpot"]["batch_size"]) == 1


def test_gpu_against_its_host_cpu(tab):
    from deepgap.analysis.decode_answer import cpu_lines

    lines = {ln.model: ln for ln in cpu_lines(tab)}
    assert "no host-CPU row of llama-3.1-8b" in lines["llama-3.1-8b"].texts[0]
    tput, tpot, energy = lines["llama-3.2-1b"].texts
    x = output_tok_s(1, 1.5, 128) / output_tok_s(4, 110.0, 16)
    assert f"= {x:,.3g}× higher on the GPU" in tput and "(eager bf16 bs1 128/128)" in tput
    assert "(eager fp32 bs4 64/16)" in tput
    assert f"= {95 / 1.5:,.3g}× lower on the GPU" in tpot and "CPU 95 ms (eager fp32 bs1 64/16)" in tpot
    assert f"= {2.0 / 0.08:,.3g}× lower" in energy


def test_show_and_recommend_print_the_answer(store, capsys):
    assert main(["show", store]) == 0
    out = capsys.readouterr().out
    assert "decode roofline" in out and "× the memory bound of" in out
    assert "lowest median TPOT: quant fp8 bs1 128/128" in out and "GPU vs host CPU" in out
    assert main(["recommend", store]) == 0
    out = capsys.readouterr().out
    assert "highest output tokens/s: eager bf16 bs8 128/128" in out and "63.3× lower on the GPU" in out
    assert main(["recommend", store, "--json"]) == 0
    assert '"workload": "decode"' in capsys.readouterr().out


def test_plan_target_tokens_per_second(store, capsys):
    argv = ["plan", store, "--model", "llama-3.1-8b", "--target-tok-s", "8000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    best = output_tok_s(8, 4.1, 128)
    assert f"{math.ceil(8000 / best)} device(s) of eager bf16 bs8 128/128" in out
    # a TPOT SLO of 3 ms leaves out bf16 (3.7, 4.1 ms): fp8 at batch 1 carries it
    assert main([*argv, "--tpot-slo", "3ms"]) == 0
    out = capsys.readouterr().out
    assert f"{math.ceil(8000 / output_tok_s(1, 2.1, 128))} device(s) of quant fp8 bs1" in out
    assert "TPOT 4.1 ms (p99 of n=381) > SLO 3 ms" in out
    assert main([*argv, "--tpot-slo", "1ms"]) == 0
    assert "none meets the SLO" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--target-tok-s", "0"], "is not a positive rate"),
        (["--target-tok-s", "1e40"], "is over 1e+09 tokens/s"),  # planned 4.6e36 devices, exit 0
        (["--target-tok-s", "100", "--ttft-slo", "90000s"], "is over a day"),
        (["--target-tok-s", "many"], "target-tok-s"),
        (["--target-tok-s", "100", "--qps", "5"], "pass one of them"),
        (["--target-tok-s", "100", "--tpot-slo", "soon"], "--tpot-slo 'soon'"),
        ([], "plan needs --qps"),
    ],
)
def test_plan_bad_input_is_one_line(store, capsys, extra, says):
    assert main(["plan", store, "--model", "llama-3.1-8b", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_plan_names_the_decoders_it_holds(store, capsys):
    assert main(["plan", store, "--model", "llama-9b", "--target-tok-s", "10"]) == 2
    assert "pass --model from: llama-3.1-8b, llama-3.2-1b" in capsys.readouterr().err


def test_report_section_and_answer_rows(store, tab):
    from deepgap.analysis import decode_section
    from deepgap.render.sections import ReportContext
    from deepgap.report.answer import answers

    parts = decode_section.build(ReportContext(store, None, False, [], pd.DataFrame(), pd.DataFrame()))
    assert {"decode", "decode_roofline", "decode_vs_host_cpu"} <= set(parts.tables)
    assert len(parts.tables["decode_roofline"]) == len(ROWS)
    (fig,) = parts.figures
    assert fig.name == "fig_decode_roofline" and not fig.draw_png().unavailable
    rows, _ = answers(pd.DataFrame(), pd.DataFrame(), tab)
    goals = set(rows["goal"])
    assert {"decode throughput", "decode TPOT", "decode per joule", "decode × host CPU"} <= goals
    tpot = rows[(rows["goal"] == "decode TPOT") & (rows["model"] == "llama-3.1-8b")].iloc[0]
    assert tpot["configuration"] == "quant fp8 bs1 128/128" and tpot["value"] == "TPOT 2.100 ms"


def test_an_interactive_report_hovers_every_decode_point(store, tab):
    """The decode roofline gets a plotly version: one point per placed row, each naming its memory bound."""
    from deepgap.analysis import decode_section
    from deepgap.render.sections import ReportContext
    from deepgap.roofline.decode_figure import placed

    parts = decode_section.build(ReportContext(store, None, True, [], pd.DataFrame(), pd.DataFrame()))
    (fig,) = parts.figures
    points = [t for t in fig.plotly["data"] if t["mode"] == "markers"]
    lines = [t for t in fig.plotly["data"] if t["mode"] == "lines"]
    rows = placed(tab)
    assert sum(len(t["x"]) for t in points) == len(rows) > 0 and lines
    hovers = [h for t in points for h in t["customdata"]]
    assert all("the memory bound of" in h[2] or "no memory bound" in h[2] for h in hovers), hovers
    assert any(h[0].startswith("llama-3.1-8b quant fp8 bs1 128/128 on ") for h in hovers), hovers
    assert {t["name"] for t in points} == set(rows["precision"])


def test_a_gpu_decode_sweep_plans_its_host_cpu():
    import argparse

    from deepgap.commands.run import add_arguments, build_spec
    from deepgap.drive.config import SweepSpec, validate
    from deepgap.drive.plan import expand
    from deepgap.drive.presets import CPU_DECODE_BATCHES, cpu_baseline_spec

    spec = SweepSpec(
        models=("llama-3.1-8b", "llama-3.2-1b"),
        engines=("eager",),
        precisions=("bf16",),
        batch_sizes=(1, 8),
        device="cuda",
        workload="decode",
        input_lens=(128,),
        output_lens=(128,),
        cpu_baseline=True,
        cpu_cores=16,
    )
    host = [c for c in expand(validate(spec), "cuda") if c.device == "cpu"]
    # the 1B shape only (the 8B model is too large for a bounded CPU part), fp32 eager, all cores
    assert [(c.model, c.precision, c.batch_size, c.input_len, c.output_len, c.threads) for c in host] == [
        ("llama-3.2-1b", "fp32", b, 64, 16, 16) for b in CPU_DECODE_BATCHES
    ]
    cpu = cpu_baseline_spec(spec, 16)
    assert (cpu.engines, cpu.precisions, cpu.device, cpu.cpu_baseline) == (
        ("eager",),
        ("fp32",),
        "cpu",
        False,
    )
    p = argparse.ArgumentParser()
    add_arguments(p)
    argv = ["--workload", "decode", "--models", "llama-tiny", "--device", "cuda"]
    assert build_spec(p.parse_args(argv)).cpu_baseline
    assert not build_spec(p.parse_args([*argv, "--no-cpu-baseline"])).cpu_baseline


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_run_measures_its_host_cpu(tmp_path, capsys):
    """A real GPU decode run of llama-3.2-1b: its host CPU's decode after it, the views set them side by side."""
    store = str(tmp_path / "s.sqlite")
    argv = [
        *(
            "run",
            "--workload",
            "decode",
            "--models",
            "llama-3.2-1b",
            "--device",
            "cuda",
            "--batch-sizes",
            "1,8",
        ),
        *("--input-lens", "64", "--output-lens", "32", "--repeats", "2", "--sweeps", "1"),
        *("--no-thermal-warmup", "--idle-time", "0", "--store", store, "--quiet"),
    ]
    assert main(argv) == 0
    assert main(["show", store]) == 0
    out = capsys.readouterr().out
    assert "× the memory bound of" in out and "GPU vs host CPU" in out and "batch-1 TPOT: GPU" in out


def test_a_gpu_decode_run_ends_with_its_host_cpu_decode(monkeypatch, tmp_path, capsys):
    """End to end without CUDA: a fake GPU runner's decode rows, then llama-tiny decoded on the CPU in process."""
    from fixtures_decode import decode_result

    from deepgap import api
    from deepgap.drive import sweep
    from deepgap.drive.config import SweepSpec
    from deepgap.drive.inprocess import InProcessWorker
    from deepgap.drive.launcher import Finished
    from deepgap.drive.runner import SweepRunner

    class FakeGpu(SweepRunner):
        def start(self):
            pass

        def environment(self):
            return {"device_name": GPU, "device": "cuda", "host": "h"}

        def results(self, configs):
            for c in configs:
                yield Finished("", decode_result(c, 0.5))

        def close(self):
            pass

    def runner(spec, device):
        return (
            FakeGpu(spec, device)
            if device != "cpu"
            else SweepRunner(spec, device, worker=InProcessWorker("cpu"))
        )

    monkeypatch.setattr(sweep, "SweepRunner", runner)
    monkeypatch.setattr(sweep, "resolve_device", lambda d: "cuda")
    for name, value in (("BATCHES", (1,)), ("OUTPUT", 4), ("MAX_INPUT", 8)):
        monkeypatch.setattr(f"deepgap.drive.presets.CPU_DECODE_{name}", value)
    spec = SweepSpec(
        models=("llama-tiny",),
        precisions=("bf16",),
        device="cuda",
        batch_sizes=(1,),
        workload="decode",
        input_lens=(12,),
        output_lens=(6,),
        telemetry=False,
        cpu_baseline=True,
        cpu_cores=1,
    )
    store = str(tmp_path / "s.sqlite")
    api.run(spec, store=store, on_event=lambda e: None)
    from deepgap.analysis.decode_section import read_table

    tab = read_table(store, None)
    assert list(zip(tab["device"], tab["status"], tab["input_len"], tab["output_len"], strict=True)) == [
        ("cuda", "ok", 12, 6),
        ("cpu", "ok", 8, 4),
    ]
    assert tab["device_name"].iloc[1] not in ("", GPU)  # the host CPU, by its own name
    assert main(["show", store]) == 0
    assert "batch-1 TPOT: GPU 0.5 ms (eager bf16 bs1 12/6) vs CPU" in capsys.readouterr().out


def test_the_answer_names_the_bound_that_binds():
    """At a large batch the compute bound is the lower: the answer's share is against it, both bounds named."""
    from deepgap.analysis.decode_answer import also_text, bound_text

    big = {"decode_tokens_per_s": 42_060.6, "fraction_of_bound": 42_060.6 / 240_959.1}
    big |= {
        "bound_tokens_per_s": 240_959.1,
        "compute_bound_tokens_per_s": 130_966.4,
        "bound_limiter": "compute",
    }
    assert bound_text(big) == "0.32× the compute bound of 130,966 tokens/s (the memory bound: 240,959)"
    one = {"decode_tokens_per_s": 430.2, "fraction_of_bound": 430.2 / 637.4, "bound_tokens_per_s": 637.4}
    one |= {"compute_bound_tokens_per_s": 130_966.4, "bound_limiter": "memory"}
    assert bound_text(one) == "0.67× the memory bound of 637 tokens/s"
    assert bound_text({"decode_tokens_per_s": 430.2}) == ""  # no bandwidth known: no share
    assert "the compute bound of 130,966" in also_text(big) and "the memory bound of 637" in also_text(one)
    from deepgap.analysis.decode_roofline import distance_text

    big |= {"batch_size": 1024, "bytes_per_token": 19.9e6, "bound_source": "H200 datasheet 4,800 GB/s"}
    big |= {"compute_bound_source": "H200 datasheet 1,979 TFLOPS"}
    assert distance_text(big).endswith("(H200 datasheet 1,979 TFLOPS) = 0.32× of it, the bound that binds")
    assert "binds" not in distance_text({**big, "bound_limiter": "memory"})
