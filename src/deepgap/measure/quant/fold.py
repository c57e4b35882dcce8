"""A torchvision ResNet as a flat list of convolutions with BatchNorm folded in.

Why a graph of our own: quantization wants one node per GEMM with everything that can ride in its
epilogue (bias, residual add, ReLU) attached, and tensor names on which scales and formats hang.
Walking the ResNet modules directly (not tracing) keeps it exact and small; anything that is not a
plain ResNet (grouped or dilated convolutions, other block types) is refused with a clear reason.

Folding (eval-mode BatchNorm after a bias-free conv), per output channel c, in float64:
    f_c = γ_c / sqrt(var_c + ε),   W'_c = W_c · f_c,   b'_c = β_c − mean_c · f_c  (+ f_c · conv bias_c)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet


class UnsupportedModelError(ValueError):
    """The module is not a network this engine can convert; the message says why."""


@dataclass(eq=False)
class Node:
    """One step of a `Graph`: its name, the tensor it reads and the tensor it writes (what every kind has)."""

    name: str
    inp: str
    out: str


@dataclass(eq=False)
class ConvNode(Node):
    """``out = act(conv(inp, weight) + bias [+ residual])`` with BatchNorm folded into weight/bias.

    ``weight`` is fp32 [Cout, Cin, k, k]; ``bias`` fp32 [Cout]. ``residual`` names a tensor added
    before the ReLU (the ResNet skip connection).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    stride: int
    padding: int
    relu: bool
    residual: str | None = None

    @property
    def kernel_size(self) -> int:
        """Spatial size k of the k×k filter."""
        return int(self.weight.shape[-1])

    @property
    def cin(self) -> int:
        """Input channels."""
        return int(self.weight.shape[1])

    @property
    def cout(self) -> int:
        """Output channels."""
        return int(self.weight.shape[0])

    @property
    def pointwise(self) -> bool:
        """A 1×1, stride-1, unpadded convolution: a plain GEMM over NHWC rows (the persistent and pair kernels')."""
        return (self.kernel_size, self.stride, self.padding) == (1, 1, 0)

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        """Output height and width for an ``h``×``w`` input."""
        k, s, p = self.kernel_size, self.stride, self.padding
        return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


@dataclass(eq=False)
class PoolNode(Node):
    """3×3 stride-2 max pooling with padding 1 (the ResNet stem)."""

    kernel_size: int = 3
    stride: int = 2
    padding: int = 1


@dataclass(eq=False)
class HeadNode(Node):
    """Global average pooling then the fully connected classifier."""

    weight: torch.Tensor  # fp32 [classes, features]
    bias: torch.Tensor  # fp32 [classes]


@dataclass(eq=False)
class ConvertNode(Node):
    """Store tensor ``inp`` again in format ``fmt`` (inserted when a tensor's readers want two formats)."""

    fmt: str


@dataclass(eq=False)
class Graph:
    """Nodes in execution order; tensors are named by strings; ``input`` is the image batch."""

    nodes: list[ConvNode | PoolNode | HeadNode | ConvertNode]
    input: str = "x"
    output: str = "logits"
    meta: dict[str, str] = field(default_factory=dict)

    def convs(self) -> list[ConvNode]:
        """The convolution nodes, in order."""
        return [n for n in self.nodes if isinstance(n, ConvNode)]

    def consumers(self, tensor: str) -> list[tuple[ConvNode | PoolNode | HeadNode, str]]:
        """(node, role) pairs reading ``tensor``; role is 'input' or 'residual'."""
        out = []
        for n in self.nodes:
            if n.inp == tensor:
                out.append((n, "input"))
            if isinstance(n, ConvNode) and n.residual == tensor:
                out.append((n, "residual"))
        return out

    def tensors(self) -> list[str]:
        """Every tensor name produced by a node, in order."""
        return [n.out for n in self.nodes]


def fold_bn(conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm into the preceding convolution; returns fp32 (weight, bias)."""
    w = conv.weight.detach().double()
    var = bn.running_var.detach().double()
    mean = bn.running_mean.detach().double()
    gamma = bn.weight.detach().double() if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.detach().double() if bn.bias is not None else torch.zeros_like(var)
    f = gamma / torch.sqrt(var + bn.eps)
    b = beta - mean * f
    if conv.bias is not None:
        b = b + conv.bias.detach().double() * f
    return (w * f.view(-1, 1, 1, 1)).float().contiguous(), b.float().contiguous()


def _conv_node(name, conv, bn, inp, out, relu, residual=None) -> ConvNode:
    if not isinstance(conv, torch.nn.Conv2d) or not isinstance(bn, torch.nn.BatchNorm2d):
        raise UnsupportedModelError(
            f"{name}: expected Conv2d + BatchNorm2d, found {type(conv).__name__} + {type(bn).__name__}"
        )
    k = conv.kernel_size
    if conv.groups != 1:
        raise UnsupportedModelError(f"{name}: grouped convolution (groups={conv.groups}) is not supported")
    if conv.dilation not in ((1, 1), 1):
        raise UnsupportedModelError(f"{name}: dilated convolution is not supported")
    if k[0] != k[1] or conv.stride[0] != conv.stride[1] or conv.padding[0] != conv.padding[1]:
        raise UnsupportedModelError(f"{name}: only square kernels, strides and paddings are supported")
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise UnsupportedModelError(f"{name}: only zero padding given as integers is supported")
    w, b = fold_bn(conv, bn)
    return ConvNode(name, inp, out, w, b, int(conv.stride[0]), int(conv.padding[0]), relu, residual)


def resnet_graph(model: torch.nn.Module) -> Graph:
    """Convert a torchvision ``ResNet`` (BasicBlock or Bottleneck) in eval mode to a folded `Graph`.

    Raises:
        UnsupportedModelError: for anything else (the message names the offending part).
    """
    if not isinstance(model, ResNet):
        raise UnsupportedModelError(
            f"the quant engine converts torchvision ResNets; got {type(model).__name__}"
        )
    if model.training:
        raise UnsupportedModelError(
            "the model is in training mode; call .eval() first (BatchNorm must use running stats)"
        )
    mp = model.maxpool
    if not isinstance(mp, torch.nn.MaxPool2d) or (mp.kernel_size, mp.stride, mp.padding) not in ((3, 2, 1),):
        raise UnsupportedModelError("stem: expected MaxPool2d(3, stride 2, padding 1)")
    if not isinstance(model.avgpool, torch.nn.AdaptiveAvgPool2d) or not isinstance(model.fc, torch.nn.Linear):
        raise UnsupportedModelError("head: expected AdaptiveAvgPool2d + Linear")
    nodes: list[ConvNode | PoolNode | HeadNode] = [
        _conv_node("conv1", model.conv1, model.bn1, "x", "stem", relu=True),
        PoolNode("maxpool", "stem", "pool"),
    ]
    cur = "pool"
    for li in range(1, 5):
        for bi, block in enumerate(getattr(model, f"layer{li}")):
            p = f"layer{li}.{bi}"
            ds = None
            if block.downsample is not None:
                seq = block.downsample
                if not isinstance(seq, torch.nn.Sequential) or len(seq) != 2:
                    raise UnsupportedModelError(f"{p}.downsample: expected Sequential(Conv2d, BatchNorm2d)")
                ds = _conv_node(f"{p}.downsample", seq[0], seq[1], cur, f"{p}.downsample", relu=False)
            skip = ds.out if ds is not None else cur
            if type(block) is Bottleneck:
                nodes.append(_conv_node(f"{p}.conv1", block.conv1, block.bn1, cur, f"{p}.conv1", relu=True))
                nodes.append(
                    _conv_node(f"{p}.conv2", block.conv2, block.bn2, f"{p}.conv1", f"{p}.conv2", relu=True)
                )
                last = (f"{p}.conv3", block.conv3, block.bn3, f"{p}.conv2")
            elif type(block) is BasicBlock:
                nodes.append(_conv_node(f"{p}.conv1", block.conv1, block.bn1, cur, f"{p}.conv1", relu=True))
                last = (f"{p}.conv2", block.conv2, block.bn2, f"{p}.conv1")
            else:
                raise UnsupportedModelError(f"{p}: unsupported block type {type(block).__name__}")
            if ds is not None:
                nodes.append(ds)
            nodes.append(_conv_node(last[0], last[1], last[2], last[3], p, relu=True, residual=skip))
            cur = p
    fc = model.fc
    b = fc.bias.detach().float() if fc.bias is not None else torch.zeros(fc.out_features)
    nodes.append(HeadNode("fc", cur, "logits", fc.weight.detach().float().contiguous(), b.contiguous()))
    return Graph(nodes)


def run_float(graph: Graph, x: torch.Tensor, observe=None) -> torch.Tensor:
    """Execute the folded graph in the dtype of ``x`` (NCHW); ``observe(name, tensor)`` sees every tensor.

    This is the fp32 reference of the folded network (equal to the original model up to rounding) and
    the calibration pass.
    """
    env = {graph.input: x}
    for i, n in enumerate(graph.nodes):
        if isinstance(n, ConvNode):
            y = F.conv2d(env[n.inp], n.weight.to(x), n.bias.to(x), n.stride, n.padding)
            if n.residual is not None:
                y = y + env[n.residual]
            if n.relu:
                y = F.relu(y)
        elif isinstance(n, PoolNode):
            y = F.max_pool2d(env[n.inp], n.kernel_size, n.stride, n.padding)
        elif isinstance(n, HeadNode):
            y = F.linear(env[n.inp].mean((2, 3)), n.weight.to(x), n.bias.to(x))
        else:
            y = env[n.inp]
        env[n.out] = y
        if observe is not None:
            observe(n.out, y)
        free_dead(graph, env, i)
    return env[graph.output]


def infer_shapes(graph: Graph, resolution: int) -> dict[str, tuple[int, int, int]]:
    """(H, W, C) of every tensor for a ``resolution``² RGB input (the head's output is (1, 1, classes))."""
    shapes = {graph.input: (resolution, resolution, 3)}
    for n in graph.nodes:
        h, w, c = shapes[n.inp]
        if isinstance(n, ConvNode):
            if c != n.cin:
                raise UnsupportedModelError(
                    f"{n.name}: expects {n.cin} input channels, tensor {n.inp} has {c}"
                )
            shapes[n.out] = (*n.out_hw(h, w), n.cout)
        elif isinstance(n, PoolNode):
            k, s, p = n.kernel_size, n.stride, n.padding
            shapes[n.out] = ((h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1, c)
        elif isinstance(n, HeadNode):
            shapes[n.out] = (1, 1, int(n.weight.shape[0]))
        else:
            shapes[n.out] = (h, w, c)
    return shapes


def conv_macs(graph: Graph, resolution: int) -> dict[str, int]:
    """Multiply-accumulates per image of every convolution (and the classifier, as 'fc')."""
    shapes = infer_shapes(graph, resolution)
    macs = {}
    for n in graph.nodes:
        if isinstance(n, ConvNode):
            oh, ow, co = shapes[n.out]
            macs[n.name] = oh * ow * co * n.cin * n.kernel_size**2
        elif isinstance(n, HeadNode):
            macs[n.name] = int(n.weight.numel())
    return macs


def free_dead(graph: Graph, env: dict, idx: int) -> None:
    """After node ``idx`` ran, drop tensors no later node reads (memory stays a few activations)."""
    later = graph.nodes[idx + 1 :]
    for name in list(env):
        if name == graph.output:
            continue
        if not any(m.inp == name or (isinstance(m, ConvNode) and m.residual == name) for m in later):
            del env[name]


def dead_after(graph: Graph, step_names: list[str]) -> list[list[str]]:
    """Tensors that can be dropped after each step of a run (last read there), the output kept.

    ``step_names``: the steps in run order, the first reading the graph's input; a name that is no node of
    the graph (the quant network's whole-network kernel, `network.WHOLE_STEP`, which reads the tensors it
    holds in its own arena) reads nothing here.
    """
    last: dict[str, int] = {}
    by_name = {n.name: n for n in graph.nodes}
    for i, name in enumerate(step_names):
        node = by_name.get(name)
        if node is None:
            continue
        reads = (
            [graph.input]
            if i == 0
            else [node.inp] + ([node.residual] if getattr(node, "residual", None) else [])
        )
        for t in reads:
            last[t] = i
    dead: list[list[str]] = [[] for _ in step_names]
    for t, i in last.items():
        if t != graph.output:
            dead[i].append(t)
    return dead
