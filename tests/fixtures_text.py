"""A text model's store for the views' unit tests: bert-base on a GPU (two sequence lengths) and its host CPU.

Written through `Store.record` (`fixtures_store.make_result`: milliseconds, no measurement). The GPU run has
eager fp32/fp16 at batches 1, 8 and 64 and sequence lengths 128 and 384, energy telemetry and a correctness
check whose output agreement is stored (the field an image classifier calls top-1); the CPU run has eager
fp32 at threads 1 and 2, batches 1 and 8, sequence 128. Every view of it must speak in sequences: seq/s,
tokens/s, ms per sequence, mJ per sequence and per token, sequence length (issue 49 item 6, issue 50 item 3).
"""

from __future__ import annotations

from fixtures_store import _env, make_result

from deepgap.core.records import ConfigSpec
from deepgap.store import Store

MODEL = "bert-base"
# precision → {seq_len: {batch: median ms}}
GPU_MS = {
    "fp32": {128: {1: 2.0, 8: 6.0, 64: 40.0}, 384: {1: 5.0, 8: 18.0, 64: 130.0}},
    "fp16": {128: {1: 1.0, 8: 2.0, 64: 9.0}, 384: {1: 2.0, 8: 5.0, 64: 30.0}},
}
CPU_MS = {1: {1: 60.0, 8: 400.0}, 2: {1: 35.0, 8: 220.0}}  # threads → {batch: ms}, fp32, seq 128
# words that name an image model's units: none may appear in a text-only view
IMAGE_WORDS = ("images/s", "img/s", "mJ/image", "mJ/img", "J/image", "per image", "top-1", "nchw", "px")


def write_text_gpu_run(store: Store, name: str = "Fixture GPU A", scale: float = 1.0) -> str:
    """bert-base on a GPU: `GPU_MS` × ``scale``, energy telemetry and an output-agreement check."""
    run = store.begin_run(
        {"models": [MODEL], "device": "cuda"}, "deepgap run (fixture)", _env("cuda", name), "0"
    )
    for prec, by_seq in GPU_MS.items():
        for seq, table in by_seq.items():
            for bs, ms in table.items():
                spec = ConfigSpec(MODEL, "eager", prec, bs, "cuda", resolution=seq, seq_len=seq)
                tp = bs / (ms * scale / 1e3)
                power = 200.0 + bs
                extra = {
                    "telemetry": {
                        "mean_power_w": power,
                        "joules_per_image": power / tp,
                        "energy_j": 2 * power,
                    },
                    "correctness": {
                        "rel_l2": 2e-3 if prec == "fp16" else 0.0,
                        "cosine": 0.99999,
                        "top1_agreement": 1.0,
                        "top1_n": 8,
                        "bound_rel_l2": 0.05,
                        "flagged": False,
                    },
                }
                store.record(
                    run, make_result(spec, ms * scale / 1e3, extra=extra, mem_bytes=2**30 + bs * 2**22)
                )
    store.finish_run(run)
    return run


def write_text_cpu_run(store: Store, name: str = "Fixture CPU") -> str:
    """bert-base on the host CPU: fp32 eager at threads 1 and 2, sequence 128, no telemetry."""
    run = store.begin_run(
        {"models": [MODEL], "device": "cpu"}, "deepgap run (fixture)", _env("cpu", name), "0"
    )
    for threads, table in CPU_MS.items():
        for bs, ms in table.items():
            spec = ConfigSpec(MODEL, "eager", "fp32", bs, "cpu", threads=threads, resolution=128, seq_len=128)
            store.record(run, make_result(spec, ms / 1e3, mem_bytes=2**29 + bs * 2**20))
    store.finish_run(run)
    return run


def build_text_store(path: str, gpu: str = "Fixture GPU A", scale: float = 1.0, cpu: bool = True) -> str:
    """Write the text store at ``path`` (a GPU run named ``gpu``, and the CPU run unless ``cpu`` is False)."""
    store = Store(path)
    try:
        write_text_gpu_run(store, gpu, scale)
        if cpu:
            write_text_cpu_run(store)
    finally:
        store.close()
    return path
