"""Time ways to run the ResNet stem (7×7/2 convolution, 3 → 64 channels, then 3×3/2 max-pool) on the GPU.

Why: the quant engine's per-layer table (`deepgap layers`) shows its stem — a cuDNN fp16 convolution
whose 3-channel input suits no tensor-core kernel, then a Triton max-pool — taking about an eighth of
ResNet-50's batch-256 time at under a tenth of its roof. This script times candidate formulations of
the same convolution so the engine can choose among measured ones. Prints one JSON line per variant.

    python benchmarks/stem_variants.py --batch-sizes 1,256
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F  # noqa: N812

from deepgap.measure.quant.tuning import time_s


def variants(x_cl: torch.Tensor, w: torch.Tensor) -> dict[str, object]:
    """name → a callable returning the stem convolution's output (any layout)."""
    w_cl = w.contiguous(memory_format=torch.channels_last)
    x_nchw = x_cl.contiguous()
    pad = torch.zeros(x_cl.shape[0], 5, *x_cl.shape[2:], device=x_cl.device, dtype=x_cl.dtype)
    x8 = torch.cat([x_cl, pad], 1).contiguous(memory_format=torch.channels_last)
    w8 = torch.cat([w, torch.zeros(w.shape[0], 5, 7, 7, device=w.device, dtype=w.dtype)], 1)
    w8 = w8.contiguous(memory_format=torch.channels_last)
    x4 = x8[:, :4].contiguous(memory_format=torch.channels_last)
    w4 = w8[:, :4].contiguous(memory_format=torch.channels_last)
    return {
        "channels_last (current)": lambda: F.conv2d(x_cl, w_cl, None, 2, 3),
        "nchw": lambda: F.conv2d(x_nchw, w.contiguous(), None, 2, 3),
        "nchw then channels_last": lambda: F.conv2d(x_nchw, w.contiguous(), None, 2, 3).contiguous(
            memory_format=torch.channels_last
        ),
        "channels padded to 8 (input pre-padded)": lambda: F.conv2d(x8, w8, None, 2, 3),
        "channels padded to 4 (input pre-padded)": lambda: F.conv2d(x4, w4, None, 2, 3),
        "pad to 8 inside": lambda: F.conv2d(
            F.pad(x_cl, (0, 0, 0, 0, 0, 5)).contiguous(memory_format=torch.channels_last), w8, None, 2, 3
        ),
        "max-pool only (torch, on the current output)": lambda: F.max_pool2d(out_cl, 3, 2, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", default="1,256")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    global out_cl
    for bs in [int(b) for b in a.batch_sizes.split(",")]:
        x = torch.randn(bs, 3, 224, 224, device="cuda").half().contiguous(memory_format=torch.channels_last)
        w = (torch.randn(64, 3, 7, 7, device="cuda") * 0.1).half()
        out_cl = F.conv2d(x, w.contiguous(memory_format=torch.channels_last), None, 2, 3)
        ref = out_cl.float()
        for name, fn in variants(x, w).items():
            try:
                t = time_s(fn, reps=20, use_graph=False)
                y = fn()
                err = float((y.float() - ref).abs().max()) if y.shape == ref.shape else None
                row = {"batch": bs, "variant": name, "ms": round(t * 1e3, 4), "max_abs_diff": err}
                print(json.dumps(row))
            except Exception as exc:  # noqa: BLE001 - report and go on
                why = f"{type(exc).__name__}: {exc}"[:200]
                print(json.dumps({"batch": bs, "variant": name, "error": why}))


if __name__ == "__main__":
    main()
