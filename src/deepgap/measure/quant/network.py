"""The quantized network: stem, quantized/fp16 convolutions and head, run step by step.

Activations live as NHWC matrices [batch·H·W, C] in their tensor's format (int8, fp8 or fp16), so
a 1×1 convolution is a plain GEMM and every layer reads and writes contiguous rows. Each layer has
a backend: 'triton' (the fused kernels), 'torch' (im2col + ``_int_mm``/``_scaled_mm`` + torch
epilogue, the no-Triton fallback) or 'reference' (exact float64 emulation, for tests). The steps
are plain Python closures over tensors, so the whole forward can be captured in one CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812

from deepgap.measure.quant import branch, layers
from deepgap.measure.quant.fold import ConvertNode, ConvNode, Graph, HeadNode, infer_shapes
from deepgap.measure.quant.stem import Stem
from deepgap.measure.quant.tiles import (
    TileConfig,
    assign_formats,
    candidate_configs,
    stem_and_pool,
    stem_tile_args,
)

if TYPE_CHECKING:
    from collections.abc import Callable

BACKENDS = ("triton", "torch", "reference")
WHOLE_STEP = "whole-network kernel"  # the step that runs every convolution (`QuantNet.whole`)


@dataclass(eq=False)
class QuantNet:
    """A folded, quantized ResNet ready to run (see `build`)."""

    graph: Graph
    qfmt: str
    fmts: dict[str, str]
    scales: dict[str, float]
    stem: Stem
    convs: dict[str, layers.QConv]
    converts: dict[str, tuple[ConvertNode, torch.Tensor, torch.Tensor]]
    head: HeadNode
    shapes: dict[str, tuple[int, int, int]]
    backend: dict[str, str] = field(default_factory=dict)
    stem_backend: str = "torch"  # 'triton' (fused max-pool kernel) or 'torch'; also used for conversions
    configs: dict[str, TileConfig] = field(default_factory=dict)
    # fused pairs (`quant.pair`): a 1×1 convolution → (the 1×1 that reads its output, the pair's tile);
    # the second runs inside the first's step (`pair_choice.choose_pairs` keeps a pair where it is faster)
    pairs: dict[str, tuple[str, Any]] = field(default_factory=dict)
    head_kernel: str = "torch"  # the head's pool: 'torch' or 'triton' (`quant.head_pool`, chosen by time)
    # every convolution in one persistent kernel (`quant.whole_plan.Plan`, kept by `whole_choice` where faster)
    whole: Any = None
    side: Any = None  # a second CUDA stream: `forward` runs the shortcut convolutions on it (`quant.branch`)

    def to(self, device) -> QuantNet:
        """Move all weights and coefficients to ``device`` (in place); returns self."""
        s = self.stem
        s.w_half = s.w_half.to(device).contiguous(memory_format=torch.channels_last)
        s.configure("int8pool" if s.pool_cfg else "int8s2d" if s.super_pixels else s.kernel, s.pad_channels)
        s.alpha, s.beta = s.alpha.to(device), s.beta.to(device)
        for c in self.convs.values():
            c.to(device)
        self.converts = {k: (n, a.to(device), b.to(device)) for k, (n, a, b) in self.converts.items()}
        self.head.weight, self.head.bias = self.head.weight.to(device), self.head.bias.to(device)
        return self

    def default_config(self, name: str, batch: int) -> TileConfig:
        """The heuristic tile configuration of convolution ``name`` at ``batch``."""
        c = self.convs[name]
        h, w, _ = self.shapes[c.node.out]
        return candidate_configs(
            batch * h * w, c.node.cout, c.node.cin, self.qfmt, c.node.residual is not None
        )[0]

    def run_conv(self, name: str, x: torch.Tensor, batch: int, res: torch.Tensor | None) -> torch.Tensor:
        """One convolution on NHWC-matrix input ``x`` with its backend; returns its output matrix."""
        layer = self.convs[name]
        n = layer.node
        h, w, _ = self.shapes[n.inp]
        nhw = (batch, h, w)
        backend = self.backend.get(name, "reference")
        if backend == "reference":
            return layers.conv_reference(layer, x, nhw, res)
        if layer.mode == "q":
            if backend == "torch":
                return layers.conv_torch(layer, x, nhw, res)
            from deepgap.measure.quant import kernels

            cfg = self.configs.get(name) or self.default_config(name, batch)
            conv_gemm = kernels.conv_gemm
            if cfg.persistent:  # a tile of the persistent TMA kernel (`tiles.persistent_configs`)
                from deepgap.measure.quant.persistent import conv_gemm
            elif cfg.tma_conv:  # a tile of the TMA-fed 3×3 convolution (`conv_tma.tma_configs`)
                from deepgap.measure.quant.conv_tma import conv_gemm
            return conv_gemm(
                x,
                nhw,
                layer.w_q,
                n.kernel_size,
                n.stride,
                n.padding,
                layer.alpha,
                layer.beta,
                layer.out_fmt,
                n.relu,
                cfg,
                res,
                layer.gamma,
            )
        acc = fp16_conv(x, nhw, layer.w_half, n.stride, n.padding)
        if backend == "torch":
            return layers.epilogue_reference(
                acc.float(), layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma
            )
        from deepgap.measure.quant import kernels

        return kernels.epilogue(acc, layer.alpha, layer.beta, layer.out_fmt, n.relu, res, layer.gamma)

    def run_pair(
        self, name: str, x: torch.Tensor, res: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolution ``name`` and the one paired with it in one kernel (`quant.pair`): both outputs."""
        from deepgap.measure.quant import pair

        second, cfg = self.pairs[name]
        return pair.run(self.convs[name], self.convs[second], x, res, cfg)

    def run_stem(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        """Image batch NCHW → the max-pooled, quantized stem output [batch·H·W, 64]."""
        s = self.stem
        n = s.conv
        b, c, hh, ww = x.shape
        if s.kernel == "int8":  # resident int8 pixels as they are; a float batch quantized first
            from deepgap.measure.quant import stem_int8, stem_s2d

            xq = x if x.dtype == torch.int8 else s.quantize(x, backend)
            args = (xq, s.w_i8, n.kernel_size, n.stride, n.padding, s.alpha_i8, s.beta, s.out_fmt)
            if s.swap_cfg:  # super pixels, the swapped convolution with the max-pool inside
                from deepgap.measure.quant import stem_swap_pool

                return stem_swap_pool.stem(*args, backend=backend, **stem_swap_pool.tile_args(s.swap_cfg))
            if s.super_pixels:  # 16-byte space-to-depth pixels
                return stem_s2d.stem(*args, backend=backend, **stem_tile_args(s.fused_cfg))
            if s.pool_cfg and backend == "triton":  # the max-pool inside the kernel
                from deepgap.measure.quant import stem_pool

                return stem_pool.stem(*args, s.pool_cfg[:2], *s.pool_cfg[2:])
            return stem_int8.stem(*args, backend=backend, **stem_tile_args(s.fused_cfg))
        if x.dtype == torch.int8:
            raise ValueError(f"int8 pixels need the int8 stem; this network's stem is {s.variant}")
        if s.kernel == "fused":
            from deepgap.measure.quant import stem_kernels

            xm = x.permute(0, 2, 3, 1).reshape(-1, c)
            return stem_kernels.stem(
                xm.half().contiguous(),
                (b, hh, ww),
                s.w_gemm,
                n.kernel_size,
                n.stride,
                n.padding,
                s.alpha,
                s.beta,
                s.out_fmt,
                block_m=s.fused_cfg[0],
                num_warps=s.fused_cfg[1],
            )
        if s.pad_channels:
            xp = torch.empty(
                (b, s.pad_channels, hh, ww),
                dtype=torch.float16,
                device=x.device,
                memory_format=torch.channels_last,
            )
            xp[:, c:].zero_()
            xp[:, :c].copy_(x)
            acc = fp16_conv(
                xp.permute(0, 2, 3, 1).reshape(-1, s.pad_channels), (b, hh, ww), s.w_pad, n.stride, n.padding
            )
        else:
            acc = fp16_conv(x.permute(0, 2, 3, 1).reshape(-1, c), (b, hh, ww), s.w_half, n.stride, n.padding)
        oh, ow = n.out_hw(hh, ww)
        if backend == "triton":
            from deepgap.measure.quant import stem_kernels

            return stem_kernels.maxpool(acc, (b, oh, ow), s.alpha, s.beta, s.out_fmt, relu=True)
        pooled = F.max_pool2d(acc.view(b, oh, ow, -1).permute(0, 3, 1, 2).float(), 3, 2, 1)
        return layers.epilogue_reference(_flat(pooled), s.alpha, s.beta, s.out_fmt, True)

    def run_head(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """Global average pool of the last activation then the classifier, in fp32 → logits.

        Why sum first and scale after: the pool then reads the 8-bit activation once (an exact int32
        sum for int8; fp32 accumulation otherwise) instead of writing and re-reading an fp32 copy of
        it twice; the per-tensor scale and 1/(H·W) multiply the pooled [batch, C] vector only. The pool is
        torch's or one Triton kernel (``head_kernel``, `quant.head_pool`); the classifier is cuBLAS's.
        """
        from deepgap.measure.quant import head_pool

        scale = (self.scales[self.head.inp] if self.fmts[self.head.inp] != "fp16" else 1.0) / (
            x.shape[0] // batch
        )
        pooled = head_pool.pool(x, batch, scale, self.head_kernel)
        return F.linear(pooled, self.head.weight, self.head.bias)

    def run_convert(self, name: str, x: torch.Tensor, backend: str) -> torch.Tensor:
        """Store a tensor again in another format."""
        node, alpha, beta = self.converts[name]
        if backend == "triton":
            from deepgap.measure.quant import kernels

            return kernels.epilogue(x, alpha, beta, node.fmt, False)
        return layers.epilogue_reference(x.float(), alpha, beta, node.fmt, False)

    def steps(self, batch: int) -> list[tuple[str, Callable[[dict], None]]]:
        """The forward pass as (name, step(env)) pairs; ``env`` maps tensor names to tensors."""
        stem_backend = self.stem_backend
        out: list[tuple[str, Callable[[dict], None]]] = []
        g = self.graph

        def stem(env):
            env[self.stem.out] = self.run_stem(env[g.input], stem_backend)

        out.append((self.stem.conv.name, stem))
        seconds = {second for second, _ in self.pairs.values()}
        plan = self.whole
        if plan is not None:

            def whole(env):
                env[plan.output] = plan.run(env[plan.input])

            out.append((WHOLE_STEP, whole))
        inside = set(plan.names) if plan is not None else set()
        for node in g.nodes[2:]:
            if isinstance(node, ConvNode) and node.name in inside:
                continue  # inside the whole-network kernel (it takes no network with a conversion)
            if isinstance(node, ConvNode) and node.name in seconds:
                continue  # runs inside the step of the convolution it is paired with
            if isinstance(node, ConvNode) and node.name in self.pairs:

                def step(env, node=node):
                    env[node.out], env[self.convs[self.pairs[node.name][0]].node.out] = self.run_pair(
                        node.name, env[node.inp], env[node.residual] if node.residual else None
                    )

            elif isinstance(node, ConvNode):

                def step(env, node=node):
                    res = env[node.residual] if node.residual else None
                    env[node.out] = self.run_conv(node.name, env[node.inp], batch, res)

            elif isinstance(node, ConvertNode):

                def step(env, node=node):
                    env[node.out] = self.run_convert(node.name, env[node.inp], stem_backend)

            elif isinstance(node, HeadNode):

                def step(env, node=node):
                    env[node.out] = self.run_head(env[node.inp], batch)

            else:
                raise ValueError(f"unexpected node {node.name} ({type(node).__name__}) after the stem")
            out.append((node.name, step))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (fp32) of an image batch ``x`` (NCHW, any float dtype, on the network's device)."""
        env = {self.graph.input: x}
        branch.run(self, self.steps(x.shape[0]), env, self.side)  # ``side``: `branch_choice.choose`
        return env[self.graph.output]


def _flat(y4: torch.Tensor) -> torch.Tensor:
    return y4.permute(0, 2, 3, 1).reshape(-1, y4.shape[1])


def fp16_conv(x: torch.Tensor, nhw, w_half: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """fp16 convolution of NHWC-matrix ``x`` → fp16 NHWC matrix (cuDNN on GPU; float64 emulation on CPU)."""
    b, h, w = nhw
    x4 = x.view(b, h, w, -1).permute(0, 3, 1, 2)
    if x.is_cuda:
        y = F.conv2d(x4.half(), w_half, None, stride, padding)
    else:
        y = F.conv2d(x4.half().double(), w_half.double(), None, stride, padding).half()
    return _flat(y).contiguous()


def build(
    graph: Graph, qfmt: str, amax: dict[str, float], modes: dict[str, str], resolution: int
) -> QuantNet:
    """Quantize ``graph`` for ``qfmt`` given calibrated ranges and each convolution's mode."""
    if qfmt not in layers.QMAX:
        raise ValueError(f"precision must be one of {layers.QFORMATS}; got {qfmt!r}")
    conv, pool = stem_and_pool(graph)
    modes = {**modes, conv.name: "fp16"}
    g2, fmts = assign_formats(graph, modes, qfmt)
    missing = [t for t in graph.tensors() if t not in amax]
    if missing:
        raise ValueError(f"calibration has no range for tensors {missing[:5]}")

    def scale(t: str) -> float:
        return 1.0 if fmts[t] == "fp16" else amax[t.split("@")[0]] / layers.QMAX[qfmt]

    scales = {t: scale(t) for t in fmts}
    s_pool = scales[pool.out]
    stem = Stem(
        conv=conv,
        out=pool.out,
        out_fmt=fmts[pool.out],
        w_half=conv.weight.half(),
        alpha=torch.full((conv.cout,), 1.0 / s_pool, dtype=torch.float32),
        beta=(conv.bias.double() / s_pool).float().contiguous(),
        in_scale=amax.get(graph.input, 0.0) / layers.QMAX["int8"],
    )
    convs, converts, head = {}, {}, None
    for node in g2.nodes[2:]:
        if isinstance(node, ConvNode):
            convs[node.name] = layers.make_qconv(node, qfmt, modes.get(node.name, "q"), fmts, scales)
        elif isinstance(node, ConvertNode):
            c = infer_shapes(graph, resolution)[node.inp][2]
            ratio = scales[node.inp] / scales[node.out]
            converts[node.name] = (node, torch.full((c,), ratio, dtype=torch.float32), torch.zeros(c))
        elif isinstance(node, HeadNode):
            head = node
    if head is None:
        raise ValueError("graph has no classifier head")
    shapes = infer_shapes(g2, resolution)
    return QuantNet(
        g2, qfmt, fmts, scales, stem, convs, converts, head, shapes, backend={n: "reference" for n in convs}
    )
