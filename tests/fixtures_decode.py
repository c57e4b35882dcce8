"""A decode store with known answers, written through `Store.record` (no measurement, milliseconds).

One GPU run ("NVIDIA H200 (fixture)": the name matches the H200's spec-sheet row, the numbers are made up)
with its host CPU's rows (``details.node_env``, as `deepgap.drive.sweep.host_cpu_results` stores them):
each row's TPOT samples are constant, so its median TPOT, decode tokens/s (batch ÷ TPOT) and output
tokens/s (batch × output ÷ (TTFT + (output − 1) × TPOT)) can be computed by hand from `ROWS`.
"""

from __future__ import annotations

from deepgap.core.records import ConfigSpec, Result, Status
from deepgap.core.result_details import Correctness, Decode, ResultDetails
from deepgap.core.stats import summarize, throughput_from_latency
from deepgap.store import Store

GPU = "NVIDIA H200 (fixture)"
CPU = "Fixture CPU"
TTFT_MS = 20.0
# a small CPU decode sweep's axes (`SweepSpec(**DECODE)`): two prompt lengths, two batches, llama-tiny eager fp32
DECODE = dict(
    models=("llama-tiny",),
    engines=("eager",),
    precisions=("fp32",),
    batch_sizes=(1, 3),
    device="cpu",
    workload="decode",
    input_lens=(8, 12),
    output_lens=(5,),
)
# (model, engine, precision, batch, TPOT ms, J/token or None, device, input, output, logits flagged)
ROWS = [
    ("llama-3.1-8b", "eager", "bf16", 1, 3.7, 0.50, "cuda:0", 128, 128, False),
    ("llama-3.1-8b", "eager", "bf16", 8, 4.1, 0.10, "cuda:0", 128, 128, False),
    ("llama-3.1-8b", "quant", "fp8", 1, 2.1, 0.30, "cuda:0", 128, 128, False),
    ("llama-3.1-8b", "quant", "fp8", 64, 9.0, 0.02, "cuda:0", 128, 128, True),  # wrong logits: never chosen
    ("llama-3.2-1b", "eager", "bf16", 1, 1.5, 0.08, "cuda:0", 128, 128, False),
    ("llama-3.2-1b", "eager", "fp32", 1, 95.0, 5.0, "cpu", 64, 16, False),
    ("llama-3.2-1b", "eager", "fp32", 4, 110.0, 2.0, "cpu", 64, 16, False),
]


def output_tok_s(bs: int, tpot_ms: float, out: int) -> float:
    """What the fixture stores as output tokens/s (the prefill's time included)."""
    return bs * out / ((TTFT_MS + (out - 1) * tpot_ms) / 1e3)


def _result(model, engine, prec, bs, tpot_ms, j, device, i, o, flagged) -> Result:
    threads = 16 if device == "cpu" else None
    spec = ConfigSpec(
        model, engine, prec, bs, device, threads=threads, resolution=i, input_len=i, output_len=o
    )
    return decode_result(spec, tpot_ms, j, flagged)


def decode_result(spec: ConfigSpec, tpot_ms: float, j: float | None = None, flagged: bool = False) -> Result:
    """A decode configuration measured at a constant ``tpot_ms`` (3 generations, TTFT `TTFT_MS`)."""
    bs, device, i, o = spec.batch_size, spec.device, spec.input_len, spec.output_len
    n = 3 * (o - 1)
    lat = summarize([tpot_ms / 1e3] * n)
    tput, lo, hi = throughput_from_latency(bs, lat)
    d = Decode(
        input_len=i,
        output_len=o,
        runs=3,
        ttft_median_s=TTFT_MS / 1e3,
        ttft_n=3,
        tpot_median_s=tpot_ms / 1e3,
        tpot_n=n,
        tpot_tail_s=tpot_ms / 1e3,
        tpot_tail_kind="p99" if n >= 368 else "max",
        decode_tok_s=tput,
        output_tok_s=output_tok_s(bs, tpot_ms, o),
        joules_per_token=j,
        cost_context=i + (o - 2) / 2,
        tokens_checked=bs * 16,  # the first 16 greedy tokens of each row against fp32's
        token_agreement=0.5 if flagged else 1.0,
    )
    details = ResultDetails(
        correctness=Correctness(rel_l2=0.2 if flagged else 1e-3, flagged=flagged), decode=d
    )
    if device == "cpu":
        details.node_env = {"device_name": CPU, "device": "cpu", "host": "fixture-host"}
    return Result(
        spec=spec,
        status=Status.OK,
        latency=lat,
        throughput_ips=tput,
        throughput_ci_low_ips=lo,
        throughput_ci_high_ips=hi,
        samples_s=[[tpot_ms / 1e3] * (o - 1)] * 3,
        details=details,
    )


def write_decode_store(path: str) -> str:
    """The store of `ROWS` at ``path``; its run id."""
    store = Store(path)
    try:
        env = {"device_name": GPU, "device": "cuda", "gpu_name": GPU, "host": "fixture-host"}
        run = store.begin_run({"workload": "decode", "device": "cuda"}, "deepgap run (fixture)", env, "0.1.0")
        for row in ROWS:
            store.record(run, _result(*row))
        store.finish_run(run)
        return run
    finally:
        store.close()
