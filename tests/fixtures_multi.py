"""A multi-engine store for the report's layout tests: five engines, INT8/FP8 quant rows, two sweep passes.

Built on `fixtures_store` (its GPU and CPU runs, written through `Store.record`), plus a second GPU run
on the same machine with ``cudagraph``, ``compile``, ``quant`` (int8, fp8) and ``onnxruntime`` rows,
channels-last variants and two sweep passes, so that one engine family holds more than eight series
and the renderer has to split it. Latencies are simple functions of the batch (known answers):
the fastest configuration for throughput is ``quant int8 channels_last bs128``, and the fp8 quant rows
at batch 64 carry a correctness flag.
"""

from __future__ import annotations

from fixtures_store import _env, build_store, make_result

from deepgap.core.records import ConfigSpec
from deepgap.store import Store

ENGINE_SPEEDUP = {"eager": 1.0, "cudagraph": 1.3, "compile": 1.6, "quant": 2.5, "onnxruntime": 1.1}
PRECISIONS = {
    "eager": ["fp32", "tf32", "fp16", "bf16"],
    "cudagraph": ["fp32", "fp16"],
    "compile": ["fp32", "fp16", "bf16"],
    "quant": ["int8", "fp8"],
    "onnxruntime": ["fp16"],
}
PREC_SPEEDUP = {"fp32": 1.0, "tf32": 1.6, "fp16": 3.0, "bf16": 2.9, "int8": 4.0, "fp8": 3.8}
BATCHES = [1, 8, 32, 128]
WRONG_FP8 = 64  # not a measured batch in BATCHES: added separately with a wrong-output flag
BEST = "quant int8 channels_last bs128"


def latency_ms(engine: str, precision: str, fmt: str, batch: int) -> float:
    """Known latency: 0.5 ms fixed cost + 0.2 ms per image, divided by the engine and precision speedups."""
    cl = 1.15 if fmt == "channels_last" else 1.0
    return 0.5 + 0.2 * batch / (ENGINE_SPEEDUP[engine] * PREC_SPEEDUP[precision] * cl)


def write_engines_run(store: Store, name: str = "Fixture GPU A") -> str:
    """A second run on the same machine as `fixtures_store.write_gpu_run`: many engines, two sweeps."""
    run_id = store.begin_run(
        {"models": ["resnet18"]}, "deepgap run --engines all (fixture)", _env("cuda", name), "0.1.0"
    )
    for engine, precs in PRECISIONS.items():
        for prec in precs:
            for fmt in ("nchw", "channels_last"):
                for bs in BATCHES:
                    for sweep in (0, 1):
                        spec = ConfigSpec(
                            "resnet18", engine, prec, bs, "cuda", memory_format=fmt, sweep=sweep
                        )
                        ms = latency_ms(engine, prec, fmt, bs) * (1 + 0.01 * sweep)
                        corr = {
                            "rel_l2": 2e-3 if prec in ("int8", "fp8") else 1e-4,
                            "cosine": 0.9999,
                            "top1_agreement": 1.0 if prec != "fp8" else 0.97,
                            "bound_rel_l2": 0.05,
                            "flagged": False,
                        }
                        store.record(
                            run_id,
                            make_result(
                                spec, ms / 1e3, mem_bytes=2**30, shift=sweep, extra={"correctness": corr}
                            ),
                        )
    for sweep in (0, 1):
        spec = ConfigSpec("resnet18", "quant", "fp8", WRONG_FP8, "cuda", sweep=sweep)
        bad = {"rel_l2": 0.4, "cosine": 0.8, "top1_agreement": 0.5, "bound_rel_l2": 0.05, "flagged": True}
        store.record(run_id, make_result(spec, 0.001, mem_bytes=2**30, extra={"correctness": bad}))
    store.finish_run(run_id)
    return run_id


def build_multi_store(path: str) -> dict[str, str]:
    """`fixtures_store.build_store` (GPU + CPU runs) plus `write_engines_run`; returns run ids by kind."""
    runs = {k: v.run_id for k, v in build_store(path).items()}
    store = Store(path)
    try:
        runs["engines"] = write_engines_run(store)
    finally:
        store.close()
    return runs
