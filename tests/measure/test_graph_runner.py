"""Graph runners own everything their graph reads (CPU): the use-after-free behind `serve --engine quant`.

A CUDA graph keeps raw addresses, so on a CPU the capture is replaced by a recorder that runs the
forward once under a dispatch mode and keeps only the *addresses* of the storages it reads (never a
reference, like a real graph). The runner passes when every such storage is still reachable from
the runner alone, and a network weight dies exactly when the runner does.
"""

from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from deepgap.core.records import ConfigSpec
from deepgap.measure import graph_runner
from deepgap.measure.engines import get_engine


class _Recorder(TorchDispatchMode):
    """Storage addresses read by the ops of a forward that were not produced inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: set[int] = set()
        self.produced: set[int] = set()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        fresh = func is torch.ops.aten.lift_fresh.default  # `torch.tensor(...)` made inside the forward
        for t in tree_leaves((args, kwargs or {})) if not fresh else ():
            if isinstance(t, torch.Tensor):
                p = t.untyped_storage().data_ptr()
                if p and p not in self.produced:
                    self.reads.add(p)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.produced.add(t.untyped_storage().data_ptr())
        return out


class _AddressGraph:
    """Stands in for ``torch.cuda.CUDAGraph``: holds the addresses it reads, no references."""

    def __init__(self, reads: set[int]) -> None:
        self.reads = frozenset(reads)

    def replay(self) -> None:
        pass


def _fake_capture(fn, static_in, device, warmup=0):
    rec = _Recorder()
    with torch.inference_mode(), rec:
        out = fn(static_in)
    return _AddressGraph(rec.reads), out


@pytest.fixture
def recorded(monkeypatch):
    """Graph capture on the CPU: the recorder instead of CUDA."""
    monkeypatch.setattr(graph_runner, "can_capture", lambda device: True)
    monkeypatch.setattr(graph_runner, "capture", _fake_capture)


def _reachable_storages(root) -> set[int]:
    """Addresses of every tensor storage reachable from ``root`` (closures, attributes, containers)."""
    seen: set[int] = set()
    ptrs: set[int] = set()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            ptrs.add(o.untyped_storage().data_ptr())
        elif isinstance(o, (types.ModuleType, type)):
            continue
        elif isinstance(o, types.FunctionType):  # its closure and attributes, not its module's globals
            stack += [c.cell_contents for c in (o.__closure__ or ()) if c.cell_contents is not None]
            stack.append(o.__dict__)
        else:
            stack.extend(gc.get_referents(o))
    return ptrs


def _unowned(run) -> set[int]:
    graph = run.graph
    return set(graph.reads) - _reachable_storages(run)


def test_the_reachability_check_can_fail(recorded):
    """A runner like the quant engine's first one (graph and static buffers only) is caught."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    x = torch.randn(1, 3, 8, 8)
    graph, out = graph_runner.capture(net, x, "cpu")

    def run(inp):
        x.copy_(inp)
        graph.replay()
        return out

    run.graph = graph
    assert _unowned(run) >= {net[0].weight.untyped_storage().data_ptr()}


@pytest.fixture(scope="module")
def quant_result(tmp_path_factory):
    import os

    from torchvision import models

    from deepgap.measure.quant.prepare import QuantOptions, prepare_quant

    os.environ["DEEPGAP_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    torch.manual_seed(0)
    opts = QuantOptions(
        calib_images=2,
        calib_method="max",
        autotune=False,
        timing_reps=1,
        force_backend="torch",
        per_layer_choice=False,
        cuda_graph=False,
    )
    return prepare_quant(models.resnet18().eval(), "int8", 1, 32, "resnet18", device="cpu", opts=opts)


def test_quant_runner_owns_its_network(recorded, quant_result):
    from deepgap.measure.quant.prepare import _make_runner

    run, info = _make_runner(quant_result.net, 1, 32, "cpu", True)
    assert info.keys() == {"cuda_graph", "repeatable"} and isinstance(run, graph_runner.GraphRunner)
    assert info["repeatable"]["plain"]["same"] and info["repeatable"]["kept"]["same"]
    assert run.graph.reads, "the recorder saw no reads"
    assert not _unowned(run), "the graph reads storages its runner does not keep alive"
    x = torch.randn(1, 3, 32, 32).half()
    assert run(x) is run.static_out  # replay writes the static output in place
    torch.testing.assert_close(run.static_in, x.contiguous(memory_format=torch.channels_last))


def test_quant_weights_die_with_the_runner_not_before(recorded, quant_result):
    from deepgap.measure.quant.network import build
    from deepgap.measure.quant.prepare import _make_runner

    q = quant_result
    modes = {n: c.mode for n, c in q.net.convs.items()}
    net = build(q.graph, "int8", q.amax, modes, 32)
    net.backend = dict(q.net.backend)
    weights = [weakref.ref(net.stem.w_half), *(weakref.ref(c.w_q) for c in net.convs.values())]
    run, _ = _make_runner(net, 1, 32, "cpu", True)
    del net
    gc.collect()
    assert all(w() is not None for w in weights), "a weight died while its runner lives"
    del run
    gc.collect()
    assert all(w() is None for w in weights), "weights outlive their runner"


def test_cudagraph_runner_owns_the_model(recorded):
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 5))
    weight = weakref.ref(model[0].weight)
    spec = ConfigSpec("tiny", "cudagraph", "fp32", 2, "cpu", resolution=8)
    prepared = get_engine("cudagraph").prepare(model.eval(), spec, torch.randn(2, 3, 8, 8))
    del model
    gc.collect()
    assert weight() is not None and not _unowned(prepared.run)
    with pytest.raises(ValueError, match="takes inputs of shape"):
        prepared.run(torch.randn(1, 3, 8, 8))
    run = prepared.run
    del prepared
    gc.collect()
    assert weight() is not None
    del run
    gc.collect()
    assert weight() is None
