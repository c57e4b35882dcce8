"""The shortcut convolutions on a second stream (`quant.branch`), on the CPU.

Here: which steps go to the side stream and in what order (ResNet-50's four downsamples, each forked after its
input and joined by its block's last convolution), when each tensor may go (never before the join of a side
step that reads it), and `branch.run`'s loop with stand-in streams: the same logits as the serial forward,
each downsample on the side stream between its fork and its join. The GPU test captures and replays it.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torchvision import models

from deepgap.core.errors import UsageError
from deepgap.measure.quant import branch
from deepgap.measure.quant.calibrate import calibration_images, collect_amax
from deepgap.measure.quant.fold import resnet_graph
from deepgap.measure.quant.network import build

DOWNSAMPLES = [f"layer{k}.0.downsample" for k in (1, 2, 3, 4)]


def _net(name: str):
    """``name``'s int8 quant network at 32², random weights, calibrated on two images."""
    torch.manual_seed(0)
    graph = resnet_graph(models.get_model(name, weights=None).eval())
    return build(graph, "int8", collect_amax(graph, calibration_images(2, 32, 0), method="max"), {}, 32)


@pytest.fixture(scope="module")
def resnet50():
    """The folded graph, and the quant network's step names (the stem's step makes its ``stem.out``)."""
    net = _net("resnet50")
    assert net.stem.out == "pool" and branch.skip_of(net) == set()
    return net.graph, [name for name, _ in net.steps(1)]


def test_resnet50s_downsamples_fork_after_their_input_and_join_at_their_blocks_end(resnet50):
    graph, names = resnet50
    s = branch.schedule(graph, names, "pool")
    assert sorted(names[i] for i in s.side) == DOWNSAMPLES
    order = [names[i] for i in s.order]
    assert sorted(order) == sorted(names)
    assert order[order.index("layer1.0.downsample") - 1] == "conv1"  # the stem made its input
    assert order[order.index("layer2.0.downsample") - 1] == "layer1.2.conv3"
    joins = {names[j]: [names[i] for i in sides] for j, sides in s.joins.items()}
    assert joins == {d.replace("downsample", "conv3"): [d] for d in DOWNSAMPLES}
    nodes = {n.name: n for n in graph.nodes}
    made = {"pool"}
    for name in order[1:]:  # every step's input and residual made before it runs
        node = nodes[name]
        assert node.inp in made and (not getattr(node, "residual", None) or node.residual in made), name
        made.add(node.out)


def test_a_step_that_may_not_move_stays_in_place(resnet50):
    graph, names = resnet50
    # a fused pair's convolution, or the block end that would join it (inside a pair or the whole kernel)
    s = branch.schedule(graph, names, "pool", skip={"layer1.0.downsample", "layer2.0.conv3"})
    assert sorted(names[i] for i in s.side) == DOWNSAMPLES[2:]
    assert branch.schedule(graph, names[:4], "pool").side == frozenset()  # its block's end is not a step


def test_a_side_steps_input_lives_until_its_join(resnet50):
    graph, names = resnet50
    s = branch.schedule(graph, names, "pool")
    dead = branch.deaths(graph, names, s)
    at = {names[i]: p for p, i in enumerate(s.order)}
    dropped = {t: p for p, ts in enumerate(dead) for t in ts}
    assert dropped["pool"] == at["layer1.0.conv3"]  # read by layer1.0.downsample, joined there
    assert dropped["layer1.2"] == at["layer2.0.conv3"]
    assert dropped["layer1.0.downsample"] == at["layer1.0.conv3"]  # its output: read once, by the join
    assert sum(len(ts) for ts in dead) == len(dropped)  # each tensor once


class _Stream:
    def __init__(self, name, log):
        self.name, self.log, self.device = name, log, torch.device("cpu")

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


def test_the_loop_with_stand_in_streams_gives_the_serial_logits(monkeypatch):
    net = _net("resnet18")
    for name in net.convs:
        net.backend[name] = "reference"
    images = torch.randn(1, 3, 32, 32).half().contiguous(memory_format=torch.channels_last)
    log, active = [], []
    main, side = _Stream("main", log), _Stream("side", log)
    conv = net.run_conv

    def recorded(name, *args):
        log.append(f"{name} on {(active or [main])[-1].name}")
        return conv(name, *args)

    @contextlib.contextmanager
    def on(stream):
        active.append(stream)
        yield
        active.pop()

    with torch.inference_mode():
        plain = net.forward(images)
        monkeypatch.setattr(net, "run_conv", recorded)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
        monkeypatch.setattr(torch.cuda, "stream", on)
        net.side = side
        assert torch.equal(net.forward(images), plain)
    for k in (2, 3, 4):  # resnet18: the first block of layer2-4 has a downsample
        fork = log.index(f"layer{k}.0.downsample on side")
        assert log[fork - 1] == "side waits main" and log[fork - 2] == f"layer{k - 1}.1.conv2 on main"
        join = log.index(f"layer{k}.0.conv2 on main")  # its residual: the downsample's output
        assert log[join - 1] == "main waits side" and fork < log.index(f"layer{k}.0.conv1 on main") < join


def test_the_choice_captures_nothing_where_it_is_not_offered(monkeypatch):
    """Off, above `branch_choice.MAX_BATCH`, on the CPU, or with no side step: the runner as it was, no info."""
    from deepgap.measure.quant import branch_choice

    net = _net("resnet18")
    runner = object()
    monkeypatch.setenv("DEEPGAP_QUANT_BRANCH", "off")
    assert branch_choice.choose(net, runner, torch.zeros(1, 3, 32, 32), "cuda", False) == (runner, None)
    monkeypatch.setenv("DEEPGAP_QUANT_BRANCH", "auto")
    big = torch.zeros(branch_choice.MAX_BATCH + 1, 3, 32, 32)
    assert branch_choice.choose(net, runner, big, "cuda", False) == (runner, None)
    assert branch_choice.choose(net, runner, torch.zeros(1, 3, 32, 32), "cpu", False) == (runner, None)
    net.pairs = {f"layer{k}.0.downsample": ("x", None) for k in (2, 3, 4)}  # none may move
    assert branch_choice.choose(net, runner, torch.zeros(1, 3, 32, 32), "cuda", False) == (runner, None)
    assert net.side is None


def test_the_switch_is_auto_by_default_and_checked(monkeypatch):
    """auto since session 43 (one H100 timed the branched graph 4.8% faster at batch 1); off still turns it off."""
    monkeypatch.delenv("DEEPGAP_QUANT_BRANCH", raising=False)
    assert branch.mode() == "auto"
    monkeypatch.setenv("DEEPGAP_QUANT_BRANCH", "off")
    assert branch.mode() == "off"
    monkeypatch.setenv("DEEPGAP_QUANT_BRANCH", "on")
    with pytest.raises(UsageError, match="DEEPGAP_QUANT_BRANCH"):
        branch.mode()
