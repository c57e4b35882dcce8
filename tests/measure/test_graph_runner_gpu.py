"""Graph-capturing engines survive losing everything but their runner (GPU; skipped without CUDA).

The use-after-free that killed ``deepgap serve --engine quant`` at its second batch size: a runner
that replays a CUDA graph but does not keep the network alive. Per engine: prepare, keep only the
runner, ``gc.collect()`` + ``torch.cuda.empty_cache()`` (the freed weights go back to the driver),
allocate and fill memory with NaN bytes (a later allocation lands on the freed addresses), replay,
and compare with the output taken before — and with the fp32 eager reference.

Run on the GPU with ``python -m pytest tests/measure/test_graph_runner_gpu.py -v -rA``.
"""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"
RES = 224
BATCH = 8
ENGINES = [  # engine, precision, memory format
    ("quant", "int8", "channels_last"),
    ("quant", "fp8", "channels_last"),
    ("cudagraph", "fp16", "channels_last"),
    ("compile-freeze", "fp16", "channels_last"),
    ("compile-reduce-overhead", "fp16", "nchw"),
    ("tensorrt", "fp16", "nchw"),
]


def _fill_free_memory(max_bytes: int = 8 << 30) -> list[torch.Tensor]:
    """Allocate up to half the free device memory (at most ``max_bytes``) in 256 MiB blocks of 0x7F bytes."""
    free, _ = torch.cuda.mem_get_info()
    block = 256 << 20
    blocks = []
    for _ in range(min(free // 2, max_bytes) // block):
        blocks.append(torch.full((block,), 0x7F, dtype=torch.uint8, device=DEV))
    torch.cuda.synchronize()
    return blocks


def _prepare(engine: str, precision: str, memory_format: str, batch: int, model):
    from deepgap.core.precision import DeviceCaps
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine

    spec = ConfigSpec("resnet18", engine, precision, batch, DEV, memory_format=memory_format, resolution=RES)
    eng = get_engine(engine)
    props = torch.cuda.get_device_properties(0)
    caps = DeviceCaps(DEV, "cuda", props.name, (props.major, props.minor), props.total_memory)
    why = eng.available() or eng.supports(spec, caps)
    if why:
        pytest.skip(why)
    x = torch.randn(batch, 3, RES, RES, generator=torch.Generator().manual_seed(1))
    if memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return eng.prepare(model, spec, x), x


@pytest.mark.parametrize("engine,precision,memory_format", ENGINES, ids=lambda v: str(v))
def test_runner_alone_keeps_its_graph_valid(engine, precision, memory_format, tmp_path, monkeypatch):
    from deepgap.measure import correctness
    from deepgap.measure.models.build import build_model

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model("resnet18", RES, None, 0)
    prepared, x = _prepare(engine, precision, memory_format, BATCH, model)
    with torch.inference_mode():
        ref = model.float().to(DEV)(x.to(DEV)).float().cpu() if engine == "quant" else None
    xd = x.to(DEV, prepared.input_dtype)
    run = prepared.run
    with torch.inference_mode():
        before = run(xd).float().cpu()
    del prepared, model
    gc.collect()
    torch.cuda.empty_cache()
    garbage = _fill_free_memory()
    with torch.inference_mode():
        after = run(xd).float().cpu()
    torch.cuda.synchronize()
    del garbage
    assert torch.isfinite(after).all(), "the replay read freed (NaN-filled) memory"
    torch.testing.assert_close(after, before, rtol=1e-3, atol=1e-3)
    if ref is not None:
        assert not correctness.compare(after, ref, precision).flagged
    del run
    torch._dynamo.reset()


def test_quant_runners_at_two_batch_sizes_both_replay(tmp_path, monkeypatch):
    """What `deepgap serve` does: one prepared runner per batch size, each kept, the results dropped."""
    from deepgap.measure.models.build import build_model

    monkeypatch.setenv("DEEPGAP_CACHE", str(tmp_path))
    runs, outs, inputs = {}, {}, {}
    for b in (4, 16):
        model = build_model("resnet18", RES, None, 0)
        prepared, x = _prepare("quant", "int8", "channels_last", b, model)
        inputs[b] = x.to(DEV, prepared.input_dtype)
        runs[b] = prepared.run
        with torch.inference_mode():
            outs[b] = runs[b](inputs[b]).float().cpu()
        del prepared, model
        gc.collect()
        torch.cuda.empty_cache()
    garbage = _fill_free_memory()
    for b, run in runs.items():
        with torch.inference_mode():
            torch.testing.assert_close(run(inputs[b]).float().cpu(), outs[b], rtol=1e-3, atol=1e-3)
    torch.cuda.synchronize()
    del garbage
