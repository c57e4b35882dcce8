"""deepgap's one FLOP counter: FLOPs and elements moved by a model, from the aten operations it runs.

The worker's ``flops_per_image`` (`deepgap.measure.worker`) and the roofline's per-model cost
(`deepgap.roofline.flops.ModelCost`) both come from here, so the two never disagree.
Why our own dispatch mode (`OpCounter`) around torch.utils.flop_counter's formulas:

- **FLOPs** follow ``torch.utils.flop_counter``: matrix multiplies, convolutions and attention, 2 FLOPs per
  multiply-accumulate, bias and elementwise work not counted. ResNet-50 at 224² is then 8.2 GFLOP = 4.1 GMAC,
  the number the literature gives. Elementwise arithmetic is estimated separately (``ew_flops``: one FLOP per
  output element of every non-copy op) for kernel-cluster rooflines, where BatchNorm/ReLU need a FLOP count.
- Two formulas are corrected: torch's ``convolution_backward`` formula (≤ 2.14) ignores ``groups`` for the
  weight gradient, which inflates MobileNetV3's training FLOPs 27×; here each computed gradient costs one
  forward convolution. And ``_native_multi_head_attention`` (the fused path ``nn.MultiheadAttention`` takes
  under ``torch.inference_mode``) has no formula in torch, so ViT-B/16 inference reads 22.5 instead of
  35.1 GFLOP; here it is counted as its projections plus the two attention matmuls. The CPU flash-attention
  kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its backward) get the CUDA kernels' formulas.
- **Traffic** is counted in tensor *elements* (and bytes in the tensors' real dtypes): every non-view op
  reads its tensor inputs once and writes its outputs once ("eager traffic", what an unfused eager step
  streams through device memory when nothing stays in cache). `deepgap.roofline.flops` turns elements into
  bytes at a precision and fits the per-image and fixed parts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

ANNOTATION_PREFIX = "dg#"  # record_function names that `OpCounter(annotate=True)` emits: dg#<op index>


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Ops that allocate or inspect without moving data.
_NO_TRAFFIC = _words(
    "empty empty_like empty_strided new_empty new_empty_strided _local_scalar_dense lift_fresh "
    "resize_ set_ record_stream is_same_size _has_compatible_shallow_copy_type _to_copy_meta"
)
# Ops that move or fill data without arithmetic (no elementwise FLOPs).
_MOVE_ONLY = _words(
    "copy_ _to_copy clone cat stack contiguous index_select gather fill_ zero_ zeros zeros_like ones "
    "ones_like full full_like new_zeros new_ones new_full constant_pad_nd repeat slice_scatter "
    "select_scatter slice_backward select_backward embedding _unsafe_view scalar_tensor "
    "_foreach_zero_ randn rand randint normal_ uniform_ bernoulli_ index masked_fill where "
    "expand_copy permute_copy transpose_copy view_copy _foreach_copy_ split_with_sizes_copy "
    "narrow_copy max_pool2d_with_indices detach_ _copy_from"
)


@dataclass
class OpRecord:
    """One aten operation as the counter saw it (element counts are per call)."""

    index: int
    op: str  # e.g. "convolution.default"
    flops: float  # flop_counter convention (matmul/conv/attention)
    ew_flops: float  # elementwise estimate: one per output element of arithmetic ops
    read_elements: float
    write_elements: float
    read_bytes: float  # in the tensors' real dtypes
    write_bytes: float

    @property
    def name(self) -> str:
        """``aten::<op>`` without the overload, as profilers name CPU ops."""
        return "aten::" + self.op.split(".")[0]


def _footprint_elements(t) -> int:
    """Distinct elements a tensor covers (an expanded, stride-0 dimension is read once)."""
    try:
        if t.numel() == 0:
            return 0
        dims = zip(t.shape, t.stride(), strict=True)
        return int(math.prod(s for s, st in dims if st != 0)) if t.dim() else 1
    except (RuntimeError, NotImplementedError):
        return int(t.numel())


def _conv_backward_flops(
    grad_output,
    input,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
    **_: Any,
) -> float:
    """Each computed gradient (input, weight) costs one forward convolution; groups respected."""
    from torch.utils.flop_counter import conv_flop_count

    fwd = conv_flop_count(list(input.shape), list(weight.shape), list(grad_output.shape), bool(transposed))
    return float(fwd * (int(bool(output_mask[0])) + int(bool(output_mask[1]))))


def _native_mha_flops(query, key, value, embed_dim, num_head, *_: Any, **__: Any) -> float:
    """Fused ``nn.MultiheadAttention``: q/k/v/out projections plus QKᵀ and AV, 2 FLOPs per MAC."""
    q = list(query.shape)
    k = list(key.shape)
    b = q[0] if len(q) == 3 else 1
    sq, sk, e = q[-2], k[-2], int(embed_dim)
    proj = 2 * b * (sq * e * e + 2 * sk * e * e + sq * e * e)
    attn = 2 * 2 * b * sq * sk * e
    return float(proj + attn)


@functools.lru_cache(maxsize=1)
def _formulas() -> dict[Any, Any]:
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    table = dict(flop_registry)
    table[aten.convolution_backward] = _conv_backward_flops
    table[aten._native_multi_head_attention] = _native_mha_flops
    # The CPU flash-attention kernels use the CUDA ones' formulas (torch has none for them).
    for cpu_op, like in (
        (aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention),
        (
            aten._scaled_dot_product_flash_attention_for_cpu_backward,
            aten._scaled_dot_product_flash_attention_backward,
        ),
    ):
        if like in table:
            table.setdefault(cpu_op, table[like])
    return table


def op_flops(func, args: tuple, kwargs: dict, out: Any) -> float:
    """FLOPs of one aten call (0 for ops outside the flop_counter convention)."""
    table = _formulas()
    fn = table.get(func._overloadpacket)
    if fn is None:
        return 0.0
    try:
        if fn in (_conv_backward_flops, _native_mha_flops):
            return fn(*args, **kwargs)
        return float(fn(*args, **kwargs, out_val=out))
    except Exception:  # an unusual overload signature: count nothing rather than guess
        return 0.0


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _make_counter_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class OpCounter(TorchDispatchMode):
        """Records every aten op (FLOPs, elements and bytes read and written); optionally annotates it.

        With ``annotate=True`` each op runs inside ``record_function("dg#<index>")``, so a profiler trace can
        tie
        the kernels an op launched back to ``records[index]`` (see `deepgap.roofline.trace`).
        """

        def __init__(self, annotate: bool = False) -> None:
            super().__init__()
            self.annotate = annotate
            self.records: list[OpRecord] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "profiler":  # record_function's own ops
                return func(*args, **kwargs)
            if func._overloadpacket not in _formulas():  # composite ops (conv2d, linear …): count their parts
                with self:
                    r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
            idx = len(self.records)
            if self.annotate:
                with torch.profiler.record_function(f"{ANNOTATION_PREFIX}{idx}"):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            self.records.append(self._account(idx, func, args, kwargs, out))
            return out

        @staticmethod
        def _account(idx, func, args, kwargs, out) -> OpRecord:
            op = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
            base = op.split(".")[0]
            if _is_view(func) or base in _NO_TRAFFIC:
                return OpRecord(idx, op, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            ins = {id(t): t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            outs = {id(t): t for t in tree_leaves(out) if isinstance(t, torch.Tensor)}
            for i, a in enumerate(func._schema.arguments):  # in-place ops that return nothing (_foreach_*_)
                if a.alias_info is not None and a.alias_info.is_write:
                    val = args[i] if i < len(args) else kwargs.get(a.name)
                    outs.update({id(t): t for t in tree_leaves(val) if isinstance(t, torch.Tensor)})
            outs = list(outs.values())
            r_el = sum(_footprint_elements(t) for t in ins.values())
            w_el = sum(_footprint_elements(t) for t in outs)
            r_b = sum(_footprint_elements(t) * t.element_size() for t in ins.values())
            w_b = sum(_footprint_elements(t) * t.element_size() for t in outs)
            flops = op_flops(func, args, kwargs, out)
            ew = 0.0
            if flops == 0.0 and base not in _MOVE_ONLY:
                ew = float(sum(t.numel() for t in outs if t.is_floating_point()))
            return OpRecord(idx, op, flops, ew, float(r_el), float(w_el), float(r_b), float(w_b))

    return OpCounter


@functools.lru_cache(maxsize=1)
def _counter_class():
    return _make_counter_class()


def op_counter(annotate: bool = False):
    """A new `OpCounter` dispatch mode (use as a context manager; read ``.records`` afterwards)."""
    return _counter_class()(annotate=annotate)


@dataclass(frozen=True)
class OpTotals:
    """Sums over the ops of one counted step."""

    flops: float
    ew_flops: float
    traffic_elements: float
    n_ops: int


def totals(records: list[OpRecord]) -> OpTotals:
    """Sum FLOPs and read+write elements over op records."""
    return OpTotals(
        flops=sum(r.flops for r in records),
        ew_flops=sum(r.ew_flops for r in records),
        traffic_elements=sum(r.read_elements + r.write_elements for r in records),
        n_ops=len(records),
    )


def count_step(model, x, mode: str = "infer", lr: float = 0.01) -> OpTotals:
    """Count one inference forward, or one training step (forward, cross-entropy, backward, SGD update).

    Args:
        model: an ``nn.Module`` already on ``x``'s device.
        x: the input batch.
        mode: ``infer`` or ``train``.
        lr: SGD learning rate of the training step (the update is counted, its value does not matter).
    """
    import torch

    counter = op_counter()
    if mode == "infer":
        model.eval()
        with torch.no_grad(), counter:
            model(x)
        return totals(counter.records)
    if mode != "train":
        raise ValueError(f"mode must be 'infer' or 'train', not {mode!r}")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=False)
    with counter:
        out = model(x)
        target = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
        loss = torch.nn.functional.cross_entropy(out.float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return totals(counter.records)


def count_flops(model, x, mode: str = "infer") -> float:
    """FLOPs of one step on batch ``x`` (flop_counter convention, with the corrections above)."""
    return count_step(model, x, mode).flops
