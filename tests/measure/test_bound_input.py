"""A device-resident batch sits in the captured graph's own input buffer (`graph_runner.bound_input`).

Why: a `GraphRunner` copies any other tensor into its static input before each replay, a launch outside the
graph (a few µs at batch 1) and a pass over the batch (0.6 GB at ResNet-50's batch 1024 in fp16) that a
deployment with bound input buffers never pays. The harness, the bare loop and serve's executor each place
their batch there.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from deepgap.measure.graph_runner import GraphRunner, bound_input


def _runner(shape=(2, 3, 4, 4), dtype=torch.float16):
    static = torch.zeros(shape, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return SimpleNamespace(static_in=static)


def test_a_matching_batch_lands_in_the_graphs_buffer_with_its_values():
    run = _runner()
    x = torch.randn(2, 3, 4, 4).half()  # NCHW: the buffer keeps its own (channels_last) layout
    got = bound_input(run, x)
    assert got is run.static_in and torch.equal(got, x)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert bound_input(run, got) is got  # already there: nothing copied again


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(1, 3, 4, 4, dtype=torch.float16),  # another batch
        torch.zeros(2, 3, 4, 4, dtype=torch.float32),  # another dtype
        torch.zeros(2, 3, 4, 4, dtype=torch.int8),  # resident codes against an fp16 graph
    ],
    ids=["shape", "dtype", "codes"],
)
def test_a_batch_the_graph_does_not_take_as_it_is_stays_where_it_was(x):
    run = _runner()
    assert bound_input(run, x) is x and not run.static_in.any()


def test_a_runner_without_a_graph_takes_the_batch_as_it_is():
    x = torch.ones(2, 3, 4, 4)
    assert bound_input(lambda t: t, x) is x
    assert bound_input(SimpleNamespace(static_in=None), x) is x


def test_serves_buffers_are_the_graphs_where_it_takes_them():
    from deepgap.serving.worker.ring import InputRing
    from deepgap.serving.worker.server import PipelinedExecutor

    graph4 = _runner((4, 3, 8, 8))
    runs = {1: lambda x: x.float().sum(dim=(2, 3)), 4: graph4}
    ex = PipelinedExecutor(runs, "cpu", torch.float16, True, InputRing(5, 8, seed=2, pin=False))
    assert ex.dev_in[4] is graph4.static_in  # the normaliser writes where the engine reads
    assert ex.dev_in[1].shape == (1, 3, 8, 8) and ex.dev_in[1] is not graph4.static_in
    ex.norm(ex.ring.images[:3], ex.dev_in[4])
    assert torch.equal(graph4.static_in[:3], ex.norm.reference(ex.ring.images[:3]).half())
    ex.close()


@pytest.mark.gpu
def test_on_a_gpu_a_bound_graph_replays_the_unbound_ones_logits():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from deepgap.measure import graph_runner

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten()).cuda().half()
    static = torch.zeros(4, 3, 16, 16, device="cuda", dtype=torch.float16)
    graph, out = graph_runner.capture(net, static, "cuda")
    run = GraphRunner(graph, static, out, owns=net)
    x = torch.randn(4, 3, 16, 16, device="cuda").half()
    with torch.inference_mode():
        copied = run(x).clone()  # the copy into the static input, as before
        bound = bound_input(run, x)
        first, second = run(bound).clone(), run(bound).clone()  # no copy: the graph must leave its input be
        want = net(x)
    assert bound is static
    assert torch.equal(first, copied) and torch.equal(second, copied)
    torch.testing.assert_close(first, want)


@pytest.mark.gpu
@pytest.mark.parametrize("engine,precision", [("quant", "fp8"), ("quant", "int8"), ("cudagraph", "fp16")])
def test_on_a_gpu_an_engines_bound_graph_leaves_its_input_be(engine, precision):
    """Each replay of the engine's graph on its own input buffer gives the logits a copied-in batch gives."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from deepgap.core.precision import DeviceCaps
    from deepgap.core.records import ConfigSpec
    from deepgap.measure.engines import get_engine
    from deepgap.measure.models.build import build_model

    spec = ConfigSpec("resnet18", engine, precision, 2, "cuda", memory_format="channels_last", resolution=224)
    eng = get_engine(engine)
    props = torch.cuda.get_device_properties(0)
    caps = DeviceCaps("cuda", "cuda", props.name, (props.major, props.minor), props.total_memory)
    why = eng.available() or eng.supports(spec, caps)
    if why:
        pytest.skip(why)
    example = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    prepared = eng.prepare(build_model("resnet18", 224, None, 0), spec, example)
    x = example.cuda().to(prepared.input_dtype).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        copied = prepared.run(x).clone()
        bound = bound_input(prepared.run, x)
        first, second = prepared.run(bound).clone(), prepared.run(bound).clone()
    assert bound is prepared.run.static_in
    assert torch.equal(first, copied) and torch.equal(second, copied)
