"""SDPA's backends at the transformer shapes deepgap measures: µs a call and TFLOPS, one backend at a time.

Why: the quant engine's attention runs through ``F.scaled_dot_product_attention`` in bf16, and torch picks
FlashAttention-2 first; cuDNN's backend has Hopper kernels. This times each backend on the layout the
encoders hand it (q, k and v as strided views of one fused qkv output, `deepgap.measure.models.bert_net`),
so ``DEEPGAP_QUANT_SDPA`` is set from a measurement. GPU only; one JSON row per (shape, backend).

    python benchmarks/sdpa_backends.py --out $OUT          # bert-base 128, bert-large 384, ViT-B/16
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn import functional as F  # noqa: N812
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {  # name: (batch, heads, seq, head_dim)
    "bert-base-s128-b256": (256, 12, 128, 64),
    "bert-base-s384-b256": (256, 12, 384, 64),
    "bert-large-s384-b128": (128, 16, 384, 64),
    "bert-large-s384-b256": (256, 16, 384, 64),
    "vit_b_16-b256": (256, 12, 197, 64),
}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip


def qkv_views(b: int, h: int, s: int, d: int) -> tuple[torch.Tensor, ...]:
    """q, k, v as bert_net makes them: (b, s, 3, h, d) permuted to three (b, h, s, d) views."""
    qkv = torch.randn(b, s, 3 * h * d, device="cuda", dtype=torch.bfloat16)
    return tuple(qkv.view(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0))


def time_backend(backend: SDPBackend, q, k, v, iters: int = 50) -> float:
    """Median µs a call over 5 windows of ``iters`` back-to-back calls (CUDA events)."""
    with sdpa_kernel([backend]), torch.inference_mode():
        for _ in range(5):
            F.scaled_dot_product_attention(q, k, v)
        out = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                F.scaled_dot_product_attention(q, k, v)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / iters)
    return sorted(out)[2]


def main() -> None:  # noqa: D103
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.shapes.split(","):
        b, h, s, d = SHAPES[name]
        q, k, v = qkv_views(b, h, s, d)
        with torch.inference_mode():
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * b * h * s * s * d
        for bname, backend in BACKENDS.items():
            row = {"shape": name, "b_h_s_d": [b, h, s, d], "backend": bname}
            try:
                with sdpa_kernel([backend]), torch.inference_mode():
                    err = (F.scaled_dot_product_attention(q, k, v).float() - ref).abs().max().item()
                us = time_backend(backend, q, k, v)
                row.update(us=round(us, 1), tflops=round(flops / us / 1e6, 1), max_abs_err=round(err, 4))
            except RuntimeError as exc:  # a backend that cannot take the shape is a row, not a stop
                row["error"] = str(exc).splitlines()[0][:200]
            print(json.dumps(row), flush=True)
            with open(a.out / "sdpa_backends.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
