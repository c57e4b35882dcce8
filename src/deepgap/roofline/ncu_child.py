"""The process Nsight Compute profiles (``python -m deepgap.roofline.ncu_child``): warm-up, bracketed steps.

Warm-up (and cuDNN autotuning) runs before ``cudaProfilerStart``; ``ncu --profile-from-start off`` records
only the kernels between ``cudaProfilerStart`` and ``cudaProfilerStop``: exactly ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import sys

import torch


def _child(argv: list[str]) -> int:
    from deepgap.roofline.profile import ProfileSpec
    from deepgap.roofline.profile_measure import build_step

    p = argparse.ArgumentParser(prog="python -m deepgap.roofline.ncu_child")
    for flag, kind in (
        ("--model", str),
        ("--precision", str),
        ("--batch-size", int),
        ("--mode", str),
        ("--device", str),
        ("--resolution", int),
        ("--memory-format", str),
        ("--warmup", int),
        ("--steps", int),
        ("--seed", int),
    ):
        p.add_argument(flag, type=kind, required=True)
    a = p.parse_args(argv)
    spec = ProfileSpec(
        a.model,
        a.precision,
        a.batch_size,
        a.mode,
        a.device,
        a.resolution or None,
        a.memory_format,
        a.warmup,
        a.steps,
        a.steps,
        seed=a.seed,
    )
    torch.backends.cudnn.benchmark = True
    _, step, _ = build_step(spec)
    for _ in range(max(spec.warmup, 1)):
        step()
    torch.cuda.synchronize(spec.device)
    torch.cuda.profiler.start()
    for _ in range(spec.steps):
        step()
    torch.cuda.synchronize(spec.device)
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
