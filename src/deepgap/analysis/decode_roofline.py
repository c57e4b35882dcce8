"""The roofline of decode: each stored decode configuration's bytes and FLOPs per token against its device.

Why at view time and from the shape: a decode step's bytes follow from the decoder's shape, the batch, the
mean context and the bytes per element as built (`deepgap.measure.llm_cost.decode_cost`), so they are
recomputed here from the row's model and precision: weights as stored at their precision (fp8/int8
Linears 1 byte per weight, the norms and embedding rows beside them in bf16; fp16/bf16 2; fp32/tf32 4),
plus the KV cache read at the run's mean context (the stored ``cost_context``, else input + (output − 2)/2),
1 byte per element in an fp8 cache (``kv_cache``).
A model without a known shape keeps the bytes and FLOPs the worker stored.

The ceilings it is held against are the device's: the memory bandwidth measured by ``deepgap peaks`` where
the store holds one, else the spec sheet's (``data/gpu_specs.csv``); the compute peak of the row's
precision likewise. The memory bound is bandwidth ÷ bytes per token, the compute bound peak ÷ FLOPs per
token, in tokens/s; a CPU row has no sheet, so no bound unless the store measured its ceilings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deepgap.core.precision import PRECISIONS
from deepgap.core.result_details import Decode
from deepgap.measure.llm_cost import Itemsizes, StepCost, decode_cost
from deepgap.measure.llm_workload import QUANT_PRECISIONS, kv_itemsize
from deepgap.measure.models.llama_config import SHAPES
from deepgap.roofline.model import measured_peaks
from deepgap.roofline.specs import spec_for, spec_peak

NAN = float("nan")


@dataclass(frozen=True)
class DecodeRoof:
    """One decode configuration on its roofline: its cost per token, the ceilings and the bounds they give."""

    bytes_per_token: float = NAN
    flops_per_token: float = NAN
    weight_bytes_per_step: float = NAN
    kv_bytes_per_step: float = NAN
    bandwidth_gb_s: float = NAN
    bandwidth_source: str = ""  # "NVIDIA H200 datasheet 4,800 GB/s" or "measured (deepgap peaks) …"
    peak_tflops: float = NAN
    peak_source: str = ""
    memory_bound_tok_s: float = NAN  # bandwidth / bytes per token
    compute_bound_tok_s: float = NAN  # peak FLOP/s / FLOPs per token

    @property
    def intensity(self) -> float:
        """FLOPs per byte of a decode step: the roofline's x axis (≈ 2 × batch ÷ bytes per weight)."""
        return self.flops_per_token / self.bytes_per_token if self.bytes_per_token > 0 else NAN

    @property
    def limiter(self) -> str:
        """``memory`` or ``compute``: which bound is the lower (blank without both)."""
        m, c = self.memory_bound_tok_s, self.compute_bound_tok_s
        if m != m:
            return ""
        return "compute" if c == c and c < m else "memory"


def itemsizes(precision: str, kv_cache: Any = None) -> Itemsizes:
    """Bytes per element as the decode worker builds ``precision``, its cache in ``kv_cache``'s format.

    The cache's bytes follow `deepgap.measure.llm_workload.kv_itemsize`, the rule the sweep's and serve's
    memory checks use (one byte as fp8 codes, at scale 1; else the decoder's own, bf16 beside 8-bit
    Linears), so the roofline and the checks never disagree. A precision this build does not name (a
    foreign store's row) is costed at fp32's bytes.
    """
    known = precision if precision in PRECISIONS else "fp32"
    kv = kv_itemsize(known, kv_cache or None)
    if known in QUANT_PRECISIONS:  # 8-bit Linears, the rest of the decoder in bf16
        return Itemsizes(linear=1, other=2, kv=kv)
    size = PRECISIONS[known].itemsize
    return Itemsizes(size, size, kv)


def mean_context(d: Decode) -> float:
    """The decode steps' mean tokens in the cache: the stored one, else input + (output − 2) / 2."""
    if d.cost_context is not None:
        return float(d.cost_context)
    return float(d.input_len or 0) + max((d.output_len or 2) - 2, 0) / 2


def step_cost(row: dict[str, Any], d: Decode) -> StepCost | None:
    """One decode step of the row's configuration (None for a model whose shape is not known here)."""
    shape = SHAPES.get(str(row.get("model")))
    batch = int(row.get("batch_size") or 0)
    if shape is None or batch < 1 or d.input_len is None:
        return None
    sizes = itemsizes(str(row.get("precision")), row.get("kv_cache"))
    return decode_cost(shape, batch, mean_context(d), sizes)


def _num(v: Any) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else NAN


def ceilings(row: dict[str, Any], peaks: Any = None) -> tuple[float, str, float, str]:
    """(bandwidth GB/s, its source, peak TFLOP/s of the row's precision, its source); NaN where unknown.

    ``peaks``: `deepgap.roofline.storage.peaks_frame` rows; a measured ceiling of the row's own GPU (by
    its name) wins; another device's never stands for it.
    """
    name = str(row.get("device_name") or "")
    gpu = str(row.get("device", "")).startswith("cuda")
    mine = peaks[peaks["device_name"] == name] if gpu and peaks is not None and len(peaks) else None
    measured = measured_peaks(mine, name) if mine is not None and len(mine) else {}  # this GPU's own only
    spec = spec_for(name) if gpu else None
    prec = str(row.get("precision"))
    bw, bw_src = NAN, ""
    if measured.get("memory"):
        bw, bw_src = measured["memory"], f"{name} measured (deepgap peaks) {measured['memory']:,.0f} GB/s"
    elif spec is not None and _num(spec_peak(spec, "memory")) > 0:
        bw = _num(spec_peak(spec, "memory"))
        bw_src = f"{spec['gpu']} datasheet {bw:,.0f} GB/s"
    pk, pk_src = NAN, ""
    if measured.get(prec):
        pk, pk_src = measured[prec], f"{name} measured {prec} {measured[prec]:,.4g} TFLOP/s"
    elif spec is not None and _num(spec_peak(spec, prec)) > 0:
        pk = _num(spec_peak(spec, prec))
        pk_src = f"{spec['gpu']} datasheet {prec} {pk:,.4g} TFLOP/s"
    return bw, bw_src, pk, pk_src


def roof(row: dict[str, Any], d: Decode, peaks: Any = None) -> DecodeRoof:
    """The row's `DecodeRoof`: its cost (recomputed from the shape, else as stored) and its device's bounds."""
    cost = step_cost(row, d)
    if cost is not None:
        bpt, fpt = cost.bytes_per_token, cost.flops_per_token
        wb, kb = cost.weight_bytes, cost.kv_bytes
    else:
        bpt, fpt, wb, kb = _num(d.bytes_per_token), _num(d.flops_per_token), NAN, NAN
    bw, bw_src, pk, pk_src = ceilings(row, peaks)
    return DecodeRoof(
        bytes_per_token=bpt,
        flops_per_token=fpt,
        weight_bytes_per_step=wb,
        kv_bytes_per_step=kb,
        bandwidth_gb_s=bw,
        bandwidth_source=bw_src,
        peak_tflops=pk,
        peak_source=pk_src,
        memory_bound_tok_s=bw * 1e9 / bpt if bw > 0 and bpt > 0 else NAN,
        compute_bound_tok_s=pk * 1e12 / fpt if pk > 0 and fpt > 0 else NAN,
    )


def distance_text(r: dict[str, Any]) -> str:
    """How far one row of `deepgap.analysis.decode.decode_table` is from its memory bound, both sides named.

    ``batch 1: 271 tok/s = 0.56× the memory bound of 480 tok/s (10.0 GB/token over H200 datasheet
    4,800 GB/s)``; a row without a bound says why.
    """
    rate, b = _num(r.get("decode_tokens_per_s")), _num(r.get("bound_tokens_per_s"))
    head = f"batch {r.get('batch_size')}: decode {rate:,.1f} tokens/s"
    if rate != rate:
        return f"batch {r.get('batch_size')}: no decode rate ({r.get('status')})"
    if b != b:
        return f"{head}; no memory bound (no bandwidth known for {r.get('device_name') or 'this device'})"
    gb = _num(r.get("bytes_per_token")) / 1e9
    text = (
        f"{head} = {rate / b:.2f}× the memory bound of {b:,.0f} tokens/s "
        f"({gb:,.3g} GB/token over {r.get('bound_source')})"
    )
    c = _num(r.get("compute_bound_tokens_per_s"))
    if c == c:
        text += f"; compute bound {c:,.0f} tokens/s ({r.get('compute_bound_source')})"
        if r.get("bound_limiter") == "compute" and c > 0:  # the lower bound binds: the share against it too
            text += f" = {rate / c:.2f}× of it, the bound that binds"
    return text
